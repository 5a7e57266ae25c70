package containment

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/containment/probe"
	"github.com/pve-inspect/pve-inspect/containment/probebuild"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := probebuild.RemoveTestBuild(); err != nil {
		fmt.Fprintln(os.Stderr, "remove probe build:", err)
	}
	os.Exit(code)
}

// nsGuest is a fake Guest: files land on the host (the runner's GuestDir is
// a test temp dir) and commands run in the guest namespace. Everything but
// the guest agent is real: the built probe binary, sockets, nftables.
type nsGuest struct {
	ns    *testkit.NetNS
	files []string
}

func (g *nsGuest) WriteFile(_ context.Context, path string, r io.Reader, mode fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	g.files = append(g.files, path)
	return f.Close()
}

func (g *nsGuest) Exec(ctx context.Context, argv []string, stdin []byte, timeout time.Duration) ([]byte, []byte, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := g.ns.Command(ctx, argv...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return stdout.Bytes(), stderr.Bytes(), ee.ExitCode(), nil
	}
	return stdout.Bytes(), stderr.Bytes(), 0, err
}

// zoneBed is a guest namespace behind a "node" namespace that holds every
// target: the gateway with control-plane listeners and the zone resolver,
// metadata, LAN, other-zone, public and IPv6 addresses.
type zoneBed struct {
	guest, node *testkit.NetNS
	spec        Spec
}

func newZoneBed(t *testing.T) *zoneBed {
	t.Helper()
	guest := testkit.NewNetNS(t, "pig")
	node := testkit.NewNetNS(t, "pin")
	veth := wireGuest(t, guest, node, "10.77.0.1/24", "10.77.0.2/24")
	node.IP(t, "addr", "add", "fd77::1/64", "dev", veth, "nodad")
	node.IP(t, "addr", "add", "fe80::a9fe:a9fe/64", "dev", veth, "nodad")
	for _, a := range []string{"198.51.100.1/32", "203.0.113.10/32", "169.254.169.254/32", "169.254.169.253/32",
		"100.100.100.200/32", "168.63.129.16/32", "192.168.77.10/32", "10.20.0.5/32", "fd00:ec2::254/128", "2001:db8:100::10/128"} {
		node.IP(t, "addr", "add", a, "dev", "lo")
	}
	guest.IP(t, "addr", "add", "fd77::2/64", "dev", "eth0", "nodad")
	guest.IP(t, "-6", "route", "add", "default", "via", "fd77::1")
	guest.ResolvConf(t, "nameserver 10.77.0.1\n")
	// The subtests probe back to back from one guest: the node's ICMP rate
	// limit per peer (IPv4: a burst of 6, then one a second) would starve
	// the later runs' UDP canaries, which then read as blocked. A real
	// check runs once per new VM; see the UDP rule in udp.go.
	if out, err := node.Command(context.Background(), "sysctl", "-q", "-w", "net.ipv4.icmp_ratelimit=0", "net.ipv6.icmp.ratelimit=0").CombinedOutput(); err != nil {
		t.Fatalf("sysctl: %v: %s", err, out)
	}

	for _, port := range []string{"8006", "22", "3128"} {
		node.Listen(t, "tcp", ":"+port)
	}
	testkit.ServeHTTP(t, node.Listen(t, "tcp", ":80"))
	testkit.ServeHTTPS(t, node.Listen(t, "tcp", ":443"))
	zone := testkit.DNSZone{A: map[string][]netip.Addr{
		"guest.zone1.test": {netip.MustParseAddr("10.77.0.2")},
		"example.test":     {netip.MustParseAddr("203.0.113.10")},
	}}
	testkit.ServeDNS(t, node.ListenPacket(t, "udp4", "10.77.0.1:53"), zone)
	testkit.ServeDNS(t, node.ListenPacket(t, "udp4", "169.254.169.253:53"), zone)

	return &zoneBed{guest: guest, node: node, spec: Spec{
		Gateway:      netip.MustParseAddr("10.77.0.1"),
		Subnet:       netip.MustParsePrefix("10.77.0.0/24"),
		Gateway6:     netip.MustParseAddr("fd77::1"),
		HostAddrs:    []netip.Addr{netip.MustParseAddr("198.51.100.1")},
		OtherZone:    []netip.AddrPort{netip.MustParseAddrPort("10.20.0.5:7")}, // nothing listens: refused, still reachable
		LAN:          []netip.AddrPort{netip.MustParseAddrPort("192.168.77.10:80")},
		Public:       []netip.Addr{netip.MustParseAddr("203.0.113.10")},
		Public6:      []netip.Addr{netip.MustParseAddr("2001:db8:100::10")},
		ExternalName: "example.test",
		LocalName:    "guest.zone1.test",
		Timeout:      800 * time.Millisecond,
	}}
}

// wireGuest links guest's eth0 to node by a veth pair, gives both ends
// their address (CIDR form) and the guest a default route via the node's,
// and returns the node end's name.
func wireGuest(t *testing.T, guest, node *testkit.NetNS, nodeAddr, guestAddr string) string {
	t.Helper()
	veth := testkit.RandomName("piv")
	node.IP(t, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", guest.Name)
	node.IP(t, "link", "set", veth, "up")
	node.IP(t, "addr", "add", nodeAddr, "dev", veth)
	guest.IP(t, "link", "set", "eth0", "up")
	guest.IP(t, "addr", "add", guestAddr, "dev", "eth0")
	guest.IP(t, "route", "add", "default", "via", netip.MustParsePrefix(nodeAddr).Addr().String())
	return veth
}

// guardRules drop on the node what the host guard drops.
const guardRules = `table inet pitest {
	chain input {
		type filter hook input priority 0; policy accept;
		tcp dport { 8006, 22, 3128 } drop
		ip daddr { 169.254.169.254, 169.254.169.253, 100.100.100.200, 168.63.129.16, 192.168.77.10, 10.20.0.5 } drop
		ip6 daddr { fd00:ec2::254, fe80::a9fe:a9fe, 2001:db8:100::10 } drop
		ip daddr 10.77.0.1 udp dport != { 53, 67 } drop
		ip daddr 198.51.100.1 meta l4proto udp drop
		ip6 daddr fd77::1 meta l4proto udp drop
	}
}
`

// deadRules let nothing from the guest in but IPv6 neighbour discovery.
const deadRules = `table inet pitest {
	chain input {
		type filter hook input priority 0; policy accept;
		iifname "lo" accept
		icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept
		drop
	}
}
`

func runBed(t *testing.T, b *zoneBed, pol Policy) *Result {
	t.Helper()
	plan, err := NewPlan(b.spec, pol)
	if err != nil {
		t.Fatal(err)
	}
	g := &nsGuest{ns: b.guest}
	r := &Runner{ProbePath: probebuild.ForTest(t), GuestDir: t.TempDir(), Concurrency: 16}
	res, err := r.Run(context.Background(), g, plan)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	for _, f := range g.files {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("uploaded probe %s still there after the run (stat: %v)", f, err)
		}
	}
	var buf bytes.Buffer
	if err := res.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	t.Logf("policy %s:\n%s", pol.Name, buf.String())
	return res
}

func rowsBy(res *Result, status Status) []string {
	var out []string
	for _, r := range res.Rows {
		if r.Status == status {
			out = append(out, r.Name)
		}
	}
	return out
}

func TestRunnerInNamespaces(t *testing.T) {
	b := newZoneBed(t)

	t.Run("open network, open policy", func(t *testing.T) {
		res := runBed(t, b, OpenPolicy())
		if !res.Passed() || !res.ControlsOK {
			t.Fatalf("bed honesty: failed rows %v", res.Failed())
		}
		for _, r := range res.Rows {
			if r.Name == "other zone guest 10.20.0.5" && !strings.Contains(r.Detail, "refused") {
				t.Errorf("other zone row detail %q: want the refusal shown", r.Detail)
			}
		}
	})

	t.Run("open network, guard policy finds the leaks", func(t *testing.T) {
		res := runBed(t, b, GuardPolicy())
		if res.Passed() || !res.ControlsOK {
			t.Fatalf("passed=%v controls=%v, want a failed check with working controls", res.Passed(), res.ControlsOK)
		}
		plan, _ := NewPlan(b.spec, GuardPolicy())
		want := 0
		for _, c := range plan.Checks {
			if c.Expect == Blocked {
				want++
			}
		}
		if got := rowsBy(res, Fail); len(got) != want {
			t.Errorf("%d failed rows %v, want every one of the %d blocked-expected checks", len(got), got, want)
		}
	})

	b.node.NFT(t, guardRules)
	t.Run("guarded network, guard policy", func(t *testing.T) {
		res := runBed(t, b, GuardPolicy())
		if !res.Passed() {
			t.Fatalf("failed rows: %+v", res.Failed())
		}
		for _, r := range res.Rows {
			if r.Expect == Blocked && r.Observed != Blocked {
				t.Errorf("%s: observed %s", r.Name, r.Observed)
			}
		}
	})

	t.Run("guarded network, lockdown policy", func(t *testing.T) {
		res := runBed(t, b, LockdownPolicy())
		got := rowsBy(res, Fail)
		want := []string{"public HTTP 203.0.113.10", "public HTTPS 203.0.113.10", "zone resolver recurses for example.test",
			"public 203.0.113.10 answers a closed UDP port with ICMP port unreachable (UDP canary)"}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("failed rows %v, want %v", got, want)
		}
	})

	b.node.NFT(t, "delete table inet pitest\n"+deadRules)
	t.Run("dead network never passes", func(t *testing.T) {
		res := runBed(t, b, LockdownPolicy())
		if res.Passed() || res.ControlsOK {
			t.Fatalf("passed=%v controls=%v on a dead network", res.Passed(), res.ControlsOK)
		}
		// only the static lease and the guest's own loopback (the UDP self-check)
		if n := len(rowsBy(res, Pass)); n != 2 {
			t.Errorf("%d rows PASS on a dead network, want 2 (the lease, the UDP self-check): %v", n, rowsBy(res, Pass))
		}
		if len(rowsBy(res, Unproven)) == 0 {
			t.Error("no UNPROVEN rows on a dead network")
		}
	})
}

// scriptedGuest returns fixed exec output.
type scriptedGuest struct {
	stdout, stderr []byte
	exit           int
	err            error
	writeErr       error
}

func (g *scriptedGuest) WriteFile(context.Context, string, io.Reader, fs.FileMode) error {
	return g.writeErr
}

func (g *scriptedGuest) Exec(context.Context, []string, []byte, time.Duration) ([]byte, []byte, int, error) {
	return g.stdout, g.stderr, g.exit, g.err
}

// scriptedPlan is a small plan of pol (SSH on the gateway, the resolver
// rows, HTTP(S) to public) for scripted guests, and a probe file to upload
// that never runs.
func scriptedPlan(t *testing.T, pol Policy, public ...netip.Addr) (*Plan, string) {
	t.Helper()
	spec := Spec{Gateway: netip.MustParseAddr("10.10.1.1"), Metadata: []netip.Addr{}, MetadataDNS: []netip.Addr{}, ControlPorts: []Port{{22, "SSH"}},
		UDPPorts: []Port{}, PeerUDPPorts: []Port{},
		ExternalName: "example.test", LocalName: "a.zone.test", Public: public}
	plan, err := NewPlan(spec, pol)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "probe")
	if err := os.WriteFile(bin, []byte("not really"), 0o755); err != nil {
		t.Fatal(err)
	}
	return plan, bin
}

func TestRunnerHostileOutput(t *testing.T) {
	plan, bin := scriptedPlan(t, LockdownPolicy())
	results := func(ids ...string) string {
		var parts []string
		for _, id := range ids {
			parts = append(parts, `{"id":"`+id+`","outcome":"timeout","elapsed_ms":1}`)
		}
		return `{"version":1,"facts":{"interfaces":[],"resolvers":[]},"results":[` + strings.Join(parts, ",") + `]}`
	}
	if len(plan.Checks) != 3 {
		t.Fatalf("plan has %d checks, want 3", len(plan.Checks))
	}
	cases := []struct {
		name string
		g    *scriptedGuest
		err  string
	}{
		{"upload fails", &scriptedGuest{writeErr: fmt.Errorf("disk full")}, "upload"},
		{"exec fails", &scriptedGuest{err: fmt.Errorf("agent gone")}, "exec"},
		{"exit code", &scriptedGuest{exit: 2, stderr: []byte("bad\x1b[2J")}, `exit 2: bad\x1b[2J`},
		{"garbage", &scriptedGuest{stdout: []byte("hello")}, "decode"},
		{"huge", &scriptedGuest{stdout: bytes.Repeat([]byte("x"), probe.MaxReportBytes+1)}, "too large"},
		{"missing result", &scriptedGuest{stdout: []byte(results("c1", "c2"))}, "lacks 1 of 3"},
		{"extra result", &scriptedGuest{stdout: []byte(results("c1", "c2", "c3", "c9"))}, `"c9" that was not asked`},
		{"two values", &scriptedGuest{stdout: []byte(results("c1", "c2", "c3") + results("c1", "c2", "c3"))}, "trailing"},
	}
	for _, c := range cases {
		r := &Runner{ProbePath: bin}
		res, err := r.Run(context.Background(), c.g, plan)
		if err == nil || res != nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: result %v, error %v; want no result and an error with %q", c.name, res, err, c.err)
		}
	}
	// And the well-formed report is accepted and judged (no lease: fails).
	res, err := (&Runner{ProbePath: bin}).Run(context.Background(), &scriptedGuest{stdout: []byte(results("c1", "c2", "c3") + "\n")}, plan)
	if err != nil {
		t.Fatal(err)
	}
	if res.Passed() || res.ControlsOK {
		t.Errorf("no lease and no resolver answer: passed=%v controls=%v", res.Passed(), res.ControlsOK)
	}
}

func TestLocateProbe(t *testing.T) {
	built := probebuild.ForTest(t)
	if p, err := LocateProbe(built); err != nil || p != built {
		t.Errorf("LocateProbe(built) = %q, %v", p, err)
	}
	if _, err := LocateProbe(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("missing file accepted")
	}
	if _, err := LocateProbe(t.TempDir()); err == nil {
		t.Error("directory accepted")
	}
	script := filepath.Join(t.TempDir(), "sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := LocateProbe(script); err == nil {
		t.Error("shell script accepted")
	}
	if sh, err := exec.LookPath("ls"); err == nil {
		if _, err := LocateProbe(sh); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
			t.Errorf("dynamic %s: %v, want a static-build error", sh, err)
		}
	}
}

// sequenceGuest answers each exec with the next of its outputs.
type sequenceGuest struct {
	outs  []string
	execs int
}

func (g *sequenceGuest) WriteFile(context.Context, string, io.Reader, fs.FileMode) error { return nil }

func (g *sequenceGuest) Exec(context.Context, []string, []byte, time.Duration) ([]byte, []byte, int, error) {
	out := g.outs[min(g.execs, len(g.outs)-1)]
	g.execs++
	return []byte(out), nil, 0, nil
}

// TestRunnerRerunsACutProbe: a report with rows the probe cut at its
// bound is no verdict, so the run is made once more and its result is the
// answer; a report with verdicts only is not run again.
func TestRunnerRerunsACutProbe(t *testing.T) {
	plan, bin := scriptedPlan(t, LockdownPolicy())
	report := func(c2 string) string {
		return `{"version":1,"facts":{"interfaces":[],"resolvers":[]},"results":[` +
			`{"id":"c1","outcome":"timeout","elapsed_ms":1},` + c2 + `,{"id":"c3","outcome":"timeout","elapsed_ms":1}]}`
	}
	cut := report(`{"id":"c2","outcome":"error","detail":"` + probe.CutDetail + `"}`)
	done := report(`{"id":"c2","outcome":"timeout","elapsed_ms":1}`)
	detail := func(res *Result) string {
		for _, row := range res.Rows {
			if strings.Contains(row.Detail, probe.CutDetail) {
				return row.Detail
			}
		}
		return ""
	}
	for _, c := range []struct {
		name     string
		outs     []string
		execs    int
		stillCut bool
	}{
		{"cut, then done", []string{cut, done}, 2, false},
		{"cut twice", []string{cut, cut}, 2, true},
		{"done", []string{done}, 1, false},
	} {
		g := &sequenceGuest{outs: c.outs}
		res, err := (&Runner{ProbePath: bin}).Run(context.Background(), g, plan)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if g.execs != c.execs || (detail(res) != "") != c.stillCut {
			t.Errorf("%s: %d runs, cut row %q; want %d runs, cut %v", c.name, g.execs, detail(res), c.execs, c.stillCut)
		}
	}
}

// TestRunnerRerunsMissingConnectivity: a run whose only failures are
// paths expected to work that did not answer (one lost datagram on a
// loaded node) is run once more and the second run is the answer; a run
// with a leak is never run again, nor one that passed.
func TestRunnerRerunsMissingConnectivity(t *testing.T) {
	plan, bin := scriptedPlan(t, GuardPolicy(), netip.MustParseAddr("203.0.113.10"))
	// report answers every row as expected, except the row named in flip,
	// which gets the opposite.
	var recursion, blockedRow string
	for _, c := range plan.Checks {
		switch {
		case strings.HasPrefix(c.Name, "zone resolver recurses"):
			recursion = c.Target.ID
		case c.Expect == Blocked && c.Target.Kind == probe.KindTCP && blockedRow == "":
			blockedRow = c.Target.ID
		}
	}
	if recursion == "" || blockedRow == "" {
		t.Fatalf("plan lacks a recursion row (%q) or a blocked TCP row (%q): %+v", recursion, blockedRow, plan.Checks)
	}
	report := func(flip string) string {
		var parts []string
		for _, c := range plan.Checks {
			reach := c.Expect == Reachable
			if c.Target.ID == flip {
				reach = !reach
			}
			switch {
			case reach && c.Target.Kind == probe.KindDNS:
				parts = append(parts, `{"id":"`+c.Target.ID+`","outcome":"response","rcode":"NOERROR","answers":1,"elapsed_ms":1}`)
			case reach && (c.Target.Kind == probe.KindHTTP || c.Target.Kind == probe.KindHTTPS):
				parts = append(parts, `{"id":"`+c.Target.ID+`","outcome":"response","http_status":200,"elapsed_ms":1}`)
			case reach:
				parts = append(parts, `{"id":"`+c.Target.ID+`","outcome":"open","elapsed_ms":1}`)
			case c.Target.Kind == probe.KindDNS:
				parts = append(parts, `{"id":"`+c.Target.ID+`","outcome":"no_reply","elapsed_ms":1}`)
			default:
				parts = append(parts, `{"id":"`+c.Target.ID+`","outcome":"timeout","elapsed_ms":1}`)
			}
		}
		return `{"version":1,"facts":{"interfaces":[{"name":"eth0","addrs":["10.10.1.5/24"]}],"default_route4":{"iface":"eth0","gateway":"10.10.1.1"},"resolvers":["10.10.1.1"]},"results":[` +
			strings.Join(parts, ",") + `]}`
	}
	good, lost, leak := report(""), report(recursion), report(blockedRow)
	for _, c := range []struct {
		name   string
		outs   []string
		execs  int
		passed bool
	}{
		{"passes", []string{good}, 1, true},
		{"lost once, then answered", []string{lost, good}, 2, true},
		{"lost twice", []string{lost, lost}, 2, false},
		{"lost, then a leak: the leak is the answer", []string{lost, leak}, 2, false},
		{"a leak is not run again", []string{leak, good}, 1, false},
	} {
		g := &sequenceGuest{outs: c.outs}
		res, err := (&Runner{ProbePath: bin}).Run(context.Background(), g, plan)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if g.execs != c.execs || res.Passed() != c.passed {
			t.Errorf("%s: %d runs, passed %v; want %d runs, passed %v (failed %+v)", c.name, g.execs, res.Passed(), c.execs, c.passed, res.Failed())
		}
		if c.name == "lost, then a leak: the leak is the answer" && !strings.HasPrefix(res.Failed()[0].Why, "LEAK") {
			t.Errorf("%s: failed rows %+v, want the leak", c.name, res.Failed())
		}
	}
}
