package firewall

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func startGuard(t *testing.T, n *testNS, cfg Config) *Guard {
	t.Helper()
	g, err := New(cfg, WithNetNS(n.Handle()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if err := g.Start(context.Background()); err != nil {
		t.Fatalf("start: %v", err)
	}
	return g
}

var (
	prognameRE   = regexp.MustCompile(` # progname \S+`)
	tableFlagsRE = regexp.MustCompile(`(?m)^\tflags [a-z,]*\n\n`)
)

// listTable returns `nft list table inet pve-inspect` in the namespace,
// without the table's flags line and owner comment (nft 1.0.6 prints
// "flags owner" but knows no "persist"; tests check flags with Inspect).
func listTable(t *testing.T, n *testNS, extra ...string) string {
	t.Helper()
	out, err := n.nft(t, append(extra, "list", "table", "inet", TableName)...)
	if err != nil {
		t.Fatalf("nft list: %v\n%s", err, out)
	}
	out = prognameRE.ReplaceAllString(out, "")
	return tableFlagsRE.ReplaceAllString(out, "")
}

// requireOwned checks the table's kernel flags: owned by a live process
// and persistent.
func requireOwned(t *testing.T, n *testNS, cfg Config) {
	t.Helper()
	st, err := Inspect(context.Background(), cfg, WithNetNS(n.Handle()))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Present || !st.Owned || !st.Persist {
		t.Fatalf("table present=%v owned=%v persist=%v, want an owned persistent table", st.Present, st.Owned, st.Persist)
	}
}

var handleRE = regexp.MustCompile(`# handle \d+`)

// ruleHandles returns the rule handles of the table, in listing order.
func ruleHandles(t *testing.T, n *testNS) []string {
	t.Helper()
	return handleRE.FindAllString(listTable(t, n, "-a"), -1)
}

func TestGoldenAppliedTable(t *testing.T) {
	n := basicNode(t)
	g := startGuard(t, n, testConfig(t))
	if err := g.Verify(context.Background()); err != nil {
		t.Fatalf("verify after start: %v", err)
	}
	testkit.Golden(t, "table.nft", []byte(listTable(t, n)))
	requireOwned(t, n, testConfig(t))
}

func TestTamperFromOtherProcessIsRefused(t *testing.T) {
	n := basicNode(t)
	g := startGuard(t, n, testConfig(t))
	before := listTable(t, n)

	out, err := n.nft(t, "delete", "table", "inet", TableName)
	if err == nil || !strings.Contains(out, "Operation not permitted") {
		t.Errorf("nft delete table: err=%v out=%q, want EPERM", err, out)
	}
	out, err = n.nft(t, "add", "rule", "inet", TableName, "forward", "accept")
	if err == nil || !strings.Contains(out, "Operation not permitted") {
		t.Errorf("nft add rule: err=%v out=%q, want EPERM", err, out)
	}
	// the kernel skips owned tables on a ruleset flush (no error)
	out, err = n.nft(t, "flush", "ruleset")
	t.Logf("nft flush ruleset: err=%v out=%q", err, out)
	requireOwned(t, n, testConfig(t))

	if after := listTable(t, n); after != before {
		t.Errorf("table changed by another process:\n%s\nwas\n%s", after, before)
	}
	if err := g.Verify(context.Background()); err != nil {
		t.Errorf("verify after tamper attempts: %v", err)
	}
}

func TestSecondGuardIsRefusedWhileOwned(t *testing.T) {
	n := basicNode(t)
	startGuard(t, n, testConfig(t))
	g2, err := New(testConfig(t), WithNetNS(n.Handle()))
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Close()
	err = g2.Start(context.Background())
	var oe *OwnedError
	if !errors.As(err, &oe) {
		t.Fatalf("second start: %v, want *OwnedError", err)
	}
}

// TestMain runs the test binary as a table owner when asked to:
// TestKill9ThenReadopt needs a separate process owning the table.
func TestMain(m *testing.M) {
	if name := os.Getenv("PVE_GUARD_HELPER_NS"); name != "" {
		os.Exit(helperOwner(name))
	}
	os.Exit(m.Run())
}

// helperOwner starts a guard in the named namespace, says READY and holds
// the table until killed (or stdin closes).
func helperOwner(name string) int {
	ns, err := netns.GetFromName(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg := Config{Trusted: []string{"stor0"}, DnsmasqUser: "65534",
		Zones: map[string][]string{"zone1": {"vnetA", "vnetA2"}},
		// killed with SIGKILL; its state directory is the test's own
		// temporary one (a fixed path here once left a directory on the
		// host that bed guests, whose root overlays the host's, then saw)
		ProcRoot: "/nonexistent/pve-inspect-test-proc", StateDir: os.Getenv("PVE_GUARD_HELPER_STATE")}
	g, err := New(cfg, WithNetNS(ns))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := g.Start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("READY")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	// g is used after the wait, so it stays reachable while the helper
	// holds the table: unreachable, a garbage collection would finalize
	// the os.File under its netlink socket, closing the socket, and the
	// kernel drops a table's owner when the owning socket closes (the
	// table stays, persist), so the test's delete would succeed
	if err := g.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func TestKill9ThenReadopt(t *testing.T) {
	n := basicNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), "PVE_GUARD_HELPER_NS="+n.Name, "PVE_GUARD_HELPER_STATE="+t.TempDir())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	ready := false
	for sc.Scan() {
		if sc.Text() == "READY" {
			ready = true
			break
		}
	}
	if !ready {
		t.Fatal("helper never became ready")
	}
	requireOwned(t, n, testConfig(t))
	owned := listTable(t, n)
	handles := ruleHandles(t, n)
	if out, err := n.nft(t, "delete", "table", "inet", TableName); err == nil {
		t.Fatalf("delete while helper owns the table succeeded: %s", out)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	// the gap: no owner, the table and its rules stay in force
	st, err := Inspect(context.Background(), testConfig(t), WithNetNS(n.Handle()))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Present || st.Owned || !st.Persist {
		t.Fatalf("after kill -9: present=%v owned=%v persist=%v, want an orphaned persistent table", st.Present, st.Owned, st.Persist)
	}
	if got := listTable(t, n); got != owned {
		t.Errorf("table changed during the gap:\n%s", got)
	}

	g := startGuard(t, n, testConfig(t))
	if err := g.Verify(ctx); err != nil {
		t.Fatalf("verify after re-adopt: %v", err)
	}
	if got := listTable(t, n); got != owned {
		t.Errorf("re-adopted table differs (duplicates?):\n%s\nwant\n%s", got, owned)
	}
	if got := ruleHandles(t, n); !slices.Equal(got, handles) {
		t.Errorf("rule handles changed on re-adopt (rebuilt instead of adopted): %v -> %v", handles, got)
	}
	st, err = Inspect(context.Background(), testConfig(t), WithNetNS(n.Handle()))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Owned || len(st.Drifts) != 0 {
		t.Errorf("after re-adopt: owned=%v drifts=%v", st.Owned, st.Drifts)
	}
}

func TestRebuildAfterEditWhileDown(t *testing.T) {
	cases := []struct {
		name   string
		tamper [][]string
	}{
		{"deleted", [][]string{{"delete", "table", "inet", TableName}}},
		{"rule added", [][]string{{"add", "rule", "inet", TableName, "forward", "accept"}}},
		{"rule deleted", [][]string{{"flush", "chain", "inet", TableName, "guest_in"}}},
		{"set emptied", [][]string{{"flush", "set", "inet", TableName, SetMetadata4}}},
		{"made dormant", nil},
		{"chain added", [][]string{{"add", "chain", "inet", TableName, "evil", "{ type filter hook forward priority -400; policy accept; }"}}},
		{"notrack rules deleted", [][]string{{"flush", "chain", "inet", TableName, chainRawOut}}},
		{"management port removed", [][]string{{"delete", "element", "inet", TableName, SetMgmtPorts, "{ 8006 }"}}},
		{"connection limit raised", [][]string{{"flush", "chain", "inet", TableName, chainFlood},
			{"add", "rule", "inet", TableName, chainFlood, `iifname != "lo" iifname != @mgmt iifname != @trusted ct state new add @guest_conns { iifname ct count over 1000000 } counter drop comment "guest-flood-conns"`}}},
		{"DNS rate raised", [][]string{{"flush", "chain", "inet", TableName, "prerouting"},
			{"add", "rule", "inet", TableName, "prerouting", `iifname != "lo" iifname != @mgmt iifname != @trusted udp dport 53 update @guest_dns_rate { iifname timeout 60s limit rate over 100000/second burst 1000 packets } counter drop comment "guest-dns-rate-udp"`}}},
		{"DNS policer set deleted", [][]string{{"flush", "chain", "inet", TableName, "prerouting"}, {"delete", "set", "inet", TableName, SetGuestDNSRate}}},
		{"connection count set shrunk", [][]string{{"flush", "chain", "inet", TableName, chainFlood}, {"delete", "set", "inet", TableName, SetGuestConns},
			{"add", "set", "inet", TableName, SetGuestConns, "{ type ifname; flags dynamic; size 1; }"},
			{"add", "rule", "inet", TableName, chainFlood, `iifname != "lo" iifname != @mgmt iifname != @trusted ct state new add @guest_conns { iifname ct count over 2048 } counter drop comment "guest-flood-conns"`}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := basicNode(t)
			cfg := testConfig(t)
			g1, err := New(cfg, WithNetNS(n.Handle()))
			if err != nil {
				t.Fatal(err)
			}
			if err := g1.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			want := listTable(t, n)
			if err := g1.Close(); err != nil {
				t.Fatal(err)
			}
			if got := listTable(t, n); got != want {
				t.Fatalf("table changed by closing the guard:\n%s", got)
			}
			if tc.tamper == nil {
				// nft 1.0.6 cannot keep the persist flag it does not know,
				// which the kernel requires: do it over netlink
				c, err := nftables.New(nftables.WithNetNSFd(int(n.Handle())))
				if err != nil {
					t.Fatal(err)
				}
				c.AddTable(&nftables.Table{Name: TableName, Family: family, Flags: nftables.TableFlagDormant | nftables.TableFlagPersist})
				if err := c.Flush(); err != nil {
					t.Fatalf("make dormant: %v", err)
				}
				st, err := Inspect(context.Background(), cfg, WithNetNS(n.Handle()))
				if err != nil {
					t.Fatal(err)
				}
				if !slices.ContainsFunc(st.Drifts, func(d Drift) bool { return d.Kind == DriftTableFlags }) {
					t.Fatalf("dormant table not reported: %v", st.Drifts)
				}
			}
			for _, args := range tc.tamper {
				if out, err := n.nft(t, args...); err != nil {
					t.Fatalf("tamper %v: %v\n%s", args, err, out)
				}
			}
			g2 := startGuard(t, n, cfg)
			if err := g2.Verify(context.Background()); err != nil {
				t.Fatalf("verify after rebuild: %v", err)
			}
			var repairs float64
			for _, k := range []DriftKind{DriftTableMissing, DriftTableFlags, DriftRule, DriftElements, DriftChain, DriftSet} {
				repairs += testutil.ToFloat64(g2.met.repairs.WithLabelValues(string(k)))
			}
			if repairs < 1 {
				t.Errorf("change while down not counted as a repair")
			}
			if got := listTable(t, n); got != want {
				t.Errorf("rebuilt table differs:\n%s\nwant\n%s", got, want)
			}
			requireOwned(t, n, cfg)
		})
	}
}

func TestSameNamedTableWithoutFlagsIsReplaced(t *testing.T) {
	n := basicNode(t)
	for _, args := range [][]string{
		{"add", "table", "inet", TableName},
		{"add", "chain", "inet", TableName, "forward", "{ type filter hook forward priority 0; policy accept; }"},
		{"add", "rule", "inet", TableName, "forward", "accept"},
	} {
		if out, err := n.nft(t, args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	g := startGuard(t, n, testConfig(t))
	if err := g.Verify(context.Background()); err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "table.nft", []byte(listTable(t, n)))
	requireOwned(t, n, testConfig(t))
	if out, err := n.nft(t, "delete", "table", "inet", TableName); err == nil {
		t.Fatalf("replaced table is not owned: delete succeeded: %s", out)
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func setElements(t *testing.T, n *testNS, set string) string {
	t.Helper()
	out, err := n.nft(t, "list", "set", "inet", TableName, set)
	if err != nil {
		t.Fatalf("list set: %v\n%s", err, out)
	}
	i := strings.Index(out, "elements = {")
	if i < 0 {
		return ""
	}
	j := strings.Index(out[i:], "}")
	return strings.Join(strings.Fields(out[i+len("elements = {"):i+j]), " ")
}

func runGuard(t *testing.T, g *Guard) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
}

func TestManagementFollowsDefaultRoute(t *testing.T) {
	n := basicNode(t)
	eth1 := n.Bridge(t, "eth1", "198.51.100.2/24")
	g := startGuard(t, n, testConfig(t))
	if err := g.SetLockdown(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	handles := ruleHandles(t, n)
	sub, unsub := g.Subscribe()
	defer unsub()
	runGuard(t, g)

	n.DefaultVia(t, eth1, "198.51.100.1")
	eventually(t, "mgmt set follows the route to eth1", func() bool {
		return setElements(t, n, SetMgmt) == `"eth1"` && setElements(t, n, SetLockdown) == `"eth1"`
	})
	select {
	case <-sub:
	case <-time.After(time.Minute):
		t.Fatal("no classification notification")
	}
	if got := g.Management(); !slices.Equal(got, []string{"eth1"}) {
		t.Errorf("Management() = %v", got)
	}
	if got := ruleHandles(t, n); !slices.Equal(got, handles) {
		t.Errorf("rules rewritten by a set update: %v -> %v", handles, got)
	}
	if err := g.Verify(context.Background()); err != nil {
		t.Errorf("verify: %v", err)
	}
}

func TestSwitchesKeepRulesAndCounters(t *testing.T) {
	n := basicNode(t)
	g := startGuard(t, n, testConfig(t))
	ctx := context.Background()
	handles := ruleHandles(t, n)
	if got := setElements(t, n, SetLockdown); got != "" {
		t.Fatalf("lockdown set not empty when off: %q", got)
	}
	if got := setElements(t, n, SetFailClosed); got != "" {
		t.Fatalf("failclosed set not empty when off: %q", got)
	}
	if err := g.SetLockdown(ctx, true); err != nil {
		t.Fatal(err)
	}
	if err := g.SetFailClosed(ctx, true); err != nil {
		t.Fatal(err)
	}
	if got := setElements(t, n, SetLockdown); got != `"eth0"` {
		t.Errorf("lockdown set = %q", got)
	}
	if got := setElements(t, n, SetFailClosed); got != "ipv4, ipv6" {
		t.Errorf("failclosed set = %q", got)
	}
	if err := g.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.SetLockdown(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := g.SetFailClosed(ctx, false); err != nil {
		t.Fatal(err)
	}
	if got := setElements(t, n, SetLockdown) + setElements(t, n, SetFailClosed); got != "" {
		t.Errorf("sets not emptied: %q", got)
	}
	if got := ruleHandles(t, n); !slices.Equal(got, handles) {
		t.Errorf("switching rewrote rules: %v -> %v", handles, got)
	}
	if err := g.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestPeriodicVerifyRepairsDrift(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	cfg.VerifyInterval = 100 * time.Millisecond
	g := startGuard(t, n, cfg)
	runGuard(t, g)
	// Only the owner can change the table; simulate a drift through the
	// owner's own connection (a bug, or a change that raced a restart).
	// The monitor ignores the owner's own events, the periodic verify
	// catches it.
	g.mu.Lock()
	g.conn.FlushSet(newSetObjects(&nftables.Table{Name: TableName, Family: family}, g.desired)[SetMetadata4])
	err := g.conn.Flush()
	g.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "metadata4 restored by the periodic verify", func() bool {
		return strings.Contains(setElements(t, n, SetMetadata4), "169.254.0.0/16")
	})
	if got := testutil.ToFloat64(g.met.repairs.WithLabelValues(string(DriftElements))); got < 1 {
		t.Errorf("repairs{reason=set_elements} = %v, want >= 1", got)
	}
	if err := g.Verify(context.Background()); err != nil {
		t.Error(err)
	}
}

func TestMonitorEventTriggersVerify(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	cfg.VerifyInterval = time.Hour
	g := startGuard(t, n, cfg)
	started := testutil.ToFloat64(g.met.lastVerify)
	runGuard(t, g)
	// The monitor verifies once it has subscribed (for what changed
	// before); nothing else verifies here (no tick, an unchanged
	// classification applies nothing). Wait for that verify, so that the
	// change below comes after the subscription and only its event can
	// verify again.
	eventually(t, "the verify of the subscribed monitor", func() bool {
		return testutil.ToFloat64(g.met.lastVerify) > started
	})
	before := testutil.ToFloat64(g.met.lastVerify)
	// another process changes the ruleset (not our table: it cannot)
	if out, err := n.nft(t, "add", "table", "ip", "other"); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	eventually(t, "a verify triggered by the nftables event", func() bool {
		return testutil.ToFloat64(g.met.lastVerify) > before
	})
}

func TestMetrics(t *testing.T) {
	n := basicNode(t)
	g := startGuard(t, n, testConfig(t))
	// one packet that the guard drops: output is not guarded except for
	// dnsmasq, so send from a guest-like interface is not possible here;
	// instead check the counters are exported for every drop rule.
	reg, mfs := gatherGuard(t, g)
	got := map[string]int{}
	for _, mf := range mfs {
		got[mf.GetName()] = len(mf.GetMetric())
	}
	want := g.Desired().RuleCount()
	if v := gaugeValue(t, reg, "pve_inspect_guard_rules_present"); int(v) != want {
		t.Errorf("rules_present = %v, want %d", v, want)
	}
	if v := gaugeValue(t, reg, "pve_inspect_guard_rules_expected"); int(v) != want {
		t.Errorf("rules_expected = %v, want %d", v, want)
	}
	if v := gaugeValue(t, reg, "pve_inspect_guard_management_interfaces"); v != 1 {
		t.Errorf("management_interfaces = %v", v)
	}
	drops := 0
	for _, c := range append(slices.Clone(g.Desired().Chains), g.BridgeDesired().Chains...) {
		for _, r := range c.Rules {
			// a jump to egress_drop is the jumping rule's drop;
			// egress_drop's own drop is not counted again
			if (strings.HasSuffix(r.Text, "drop") && c.Name != chainEgressDrop) || strings.HasSuffix(r.Text, "jump "+chainEgressDrop) {
				drops++
			}
		}
	}
	if got["pve_inspect_guard_rule_drop_packets_total"] != drops {
		t.Errorf("drop counters for %d rules, want %d", got["pve_inspect_guard_rule_drop_packets_total"], drops)
	}
	if v := gaugeValue(t, reg, "pve_inspect_guard_bridge_unmapped_ports"); v != 0 {
		t.Errorf("bridge_unmapped_ports = %v, want 0 (no guest port)", v)
	}
	if v := gaugeValue(t, reg, "pve_inspect_guard_last_verify_success_timestamp_seconds"); v <= 0 {
		t.Errorf("last verify timestamp = %v", v)
	}
	problems, err := testutil.CollectAndLint(g.Collector())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric lint: %s: %s", p.Metric, p.Text)
	}
}

// gatherGuard registers g's collector in a registry of its own and
// gathers it once.
func gatherGuard(t *testing.T, g *Guard) (*prometheus.Registry, []*dto.MetricFamily) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(g.Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return reg, mfs
}

func gaugeValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not exported", name)
	return 0
}

// TestRemoveTableRestoresSysctl: Start sets the default new interfaces
// inherit (IPv6 off) and conntrack's accounting (on, for the egress
// record's flows) and saves them; guard remove puts them back.
func TestRemoveTableRestoresSysctl(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	sysctls := []struct{ rel, before, started string }{
		{ipv6DefaultSysctl, "0\n", "1\n"},
		{conntrackAcctSysctl, "0\n", "1\n"},
	}
	for _, sc := range sysctls {
		p := filepath.Join(cfg.ProcRoot, sc.rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(sc.before), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	g := startGuard(t, n, cfg)
	for _, sc := range sysctls {
		if b, _ := os.ReadFile(filepath.Join(cfg.ProcRoot, sc.rel)); string(b) != sc.started {
			t.Errorf("%s after start = %q, want %q", sc.rel, b, sc.started)
		}
	}
	var oe *OwnedError
	if err := RemoveTable(context.Background(), cfg, WithNetNS(n.Handle())); !errors.As(err, &oe) {
		t.Errorf("remove while owned: %v, want *OwnedError", err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := RemoveTable(context.Background(), cfg, WithNetNS(n.Handle())); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if out, err := n.nft(t, "list", "table", "inet", TableName); err == nil {
		t.Errorf("table still there after remove:\n%s", out)
	}
	for _, sc := range sysctls {
		if b, _ := os.ReadFile(filepath.Join(cfg.ProcRoot, sc.rel)); string(b) != sc.before {
			t.Errorf("%s after remove = %q, want %q", sc.rel, b, sc.before)
		}
	}
}

func TestSetZones(t *testing.T) {
	n := basicNode(t)
	g := startGuard(t, n, testConfig(t))
	handles := ruleHandles(t, n)
	if strings.Contains(setElements(t, n, SetZonePeers), `"vnetB" . "vnetC"`) {
		t.Fatal("pair present before SetZones")
	}
	if err := g.SetZones(context.Background(), map[string][]string{"z2": {"vnetB", "vnetC"}}); err != nil {
		t.Fatal(err)
	}
	got := setElements(t, n, SetZonePeers)
	for _, want := range []string{`"vnetB" . "vnetC"`, `"vnetC" . "vnetB"`, `"vnetA" . "vnetA2"`} {
		if !strings.Contains(got, want) {
			t.Errorf("zone_peers lacks %s: %s", want, got)
		}
	}
	if err := g.Verify(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := Inspect(context.Background(), testConfig(t), WithNetNS(n.Handle()))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Drifts) != 0 || len(st.Notes) != 1 {
		t.Errorf("status with run-time zones: drifts %v notes %v, want no drift and one note", st.Drifts, st.Notes)
	}
	if err := g.SetZones(context.Background(), map[string][]string{"bad": {"this-name-is-too-long"}}); err == nil {
		t.Error("bad bridge name accepted")
	}
	if err := g.SetZones(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(setElements(t, n, SetZonePeers), `"vnetB" . "vnetC"`) {
		t.Error("pair still present after the zone went away")
	}
	if got := ruleHandles(t, n); !slices.Equal(got, handles) {
		t.Errorf("SetZones rewrote rules")
	}
}

// TestSysctlInNamespace: with the real /proc, the sysctl is set in the
// guard's namespace (not the caller's) and restored by RemoveTable.
func TestSysctlInNamespace(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	cfg.ProcRoot = "/proc"
	read := func() string {
		out, err := n.Command(context.Background(), "cat", "/proc/sys/net/ipv6/conf/default/disable_ipv6").CombinedOutput()
		if err != nil {
			t.Fatalf("read sysctl in netns: %v %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	ours, err := os.ReadFile("/proc/sys/net/ipv6/conf/default/disable_ipv6")
	if err != nil {
		if testkit.InCI() {
			t.Fatalf("no IPv6 sysctl in this kernel: %v", err)
		}
		t.Skip("SKIPPING: no IPv6 sysctl in this kernel")
	}
	if got := read(); got != "0" {
		t.Fatalf("fresh netns disable_ipv6 = %s", got)
	}
	g := startGuard(t, n, cfg)
	if got := read(); got != "1" {
		t.Errorf("after start: %s, want 1", got)
	}
	if after, _ := os.ReadFile("/proc/sys/net/ipv6/conf/default/disable_ipv6"); string(after) != string(ours) {
		t.Errorf("the test process's own namespace changed: %q -> %q", ours, after)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := RemoveTable(context.Background(), cfg, WithNetNS(n.Handle())); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "0" {
		t.Errorf("after remove: %s, want 0", got)
	}
}

// TestRestartKeepsLockdownSets: a guard adopting an orphaned table with
// the lockdown and fail-closed on keeps those sets filled when started
// with the same switches (WithSwitches): nft monitor sees no element
// deleted. Without them, Start empties the sets (the control).
func TestRestartKeepsLockdownSets(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []Option
		deletes bool
	}{
		{"with the switches", []Option{WithSwitches(Switches{Lockdown: true, FailClosed: true})}, false},
		{"without (control)", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := basicNode(t)
			cfg := testConfig(t)
			ctx := context.Background()
			g := startGuard(t, n, cfg)
			if err := g.SetLockdown(ctx, true); err != nil {
				t.Fatal(err)
			}
			if err := g.SetFailClosed(ctx, true); err != nil {
				t.Fatal(err)
			}
			if err := g.Close(); err != nil { // the daemon exits: orphan
				t.Fatal(err)
			}

			mctx, cancel := context.WithCancel(ctx)
			defer cancel()
			var mon bytes.Buffer
			var mu sync.Mutex
			m := n.Command(mctx, "nft", "monitor")
			m.Stdout = writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return mon.Write(p) })
			if err := m.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cancel(); _ = m.Wait() })
			monitored := func() string { mu.Lock(); defer mu.Unlock(); return mon.String() }
			// The monitor is listening once it reports a change of our own
			// (repeated: one made before it subscribed is never reported).
			eventually(t, "nft monitor ready", func() bool {
				if out, err := n.nft(t, "add", "table", "inet", "pgd-ready"); err != nil {
					t.Fatalf("%v: %s", err, out)
				}
				if out, err := n.nft(t, "delete", "table", "inet", "pgd-ready"); err != nil {
					t.Fatalf("%v: %s", err, out)
				}
				return strings.Contains(monitored(), "pgd-ready")
			})

			g2, err := New(cfg, append([]Option{WithNetNS(n.Handle())}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = g2.Close() })
			if err := g2.Start(ctx); err != nil {
				t.Fatal(err)
			}
			// A change after Start marks the end of what Start did.
			if out, err := n.nft(t, "add", "table", "inet", "pgd-end"); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			eventually(t, "nft monitor to see the end marker", func() bool {
				return strings.Contains(monitored(), "add table inet pgd-end")
			})
			deleted := strings.Contains(monitored(), "delete element inet pve-inspect lockdown") ||
				strings.Contains(monitored(), "delete element inet pve-inspect failclosed")
			if deleted != tc.deletes {
				t.Fatalf("sets emptied during the restart: %v, want %v; monitor:\n%s", deleted, tc.deletes, monitored())
			}
			if tc.deletes {
				return
			}
			if got := setElements(t, n, SetLockdown); got != `"eth0"` {
				t.Errorf("lockdown set after the restart = %q", got)
			}
			if got := setElements(t, n, SetFailClosed); got != "ipv4, ipv6" {
				t.Errorf("failclosed set after the restart = %q", got)
			}
			if sw := g2.Switches(); !sw.Lockdown || !sw.FailClosed {
				t.Errorf("Switches() = %+v", sw)
			}
		})
	}
}

// writerFunc adapts a function to io.Writer.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
