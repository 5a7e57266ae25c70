package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/testvm"
)

const (
	accMetricsPort = 9474 // the daemon's own metrics listener (on every node address)
	accAPIPort     = 9476 // sandbox API stand-in (the bed listens there)
)

// accBed is the test bed with two zones, guest A (zonea) and B (zoneb).
type accBed struct {
	b      *testvm.Bed
	ga, gb *testvm.Guest
	cfg    string
}

func upAccBed(t *testing.T, ctx context.Context) *accBed {
	t.Helper()
	testkit.RequireRoot(t)
	b, err := testvm.Up(ctx, testvm.Options{ExtraNodePorts: []int{accAPIPort}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	for i, id := range []string{"zonea", "zoneb"} {
		n := byte(i + 1)
		v := testvm.VNet{Name: "vnet" + id[4:], Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 10, n, 0}), 24),
			Gateway: netip.AddrFrom4([4]byte{10, 10, n, 1}),
			DHCP:    []testvm.DHCPRange{{Start: netip.AddrFrom4([4]byte{10, 10, n, 100}), End: netip.AddrFrom4([4]byte{10, 10, n, 200})}}, SNAT: true}
		if err := b.AddZone(ctx, testvm.Zone{ID: id, VNets: []testvm.VNet{v}}); err != nil {
			t.Fatal(err)
		}
	}
	ga, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 101, VNet: "vneta"})
	if err != nil {
		t.Fatal(err)
	}
	gb, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 102, VNet: "vnetb"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := writeAccConfig(t, b, `zones = { zonea = ["vneta"], zoneb = ["vnetb"] }`)
	return &accBed{b: b, ga: ga, gb: gb, cfg: cfg}
}

// writeAccConfig writes the daemon's configuration for a bed: every path
// in a fresh directory, metrics on every node address, guard holding the
// extra [guard] lines; the layer-2 guard maps guest ports from the bed's
// node root (VM configs and leases in Proxmox's layout).
func writeAccConfig(t *testing.T, b *testvm.Bed, guard string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	doc := fmt.Sprintf(`[node]
id = "acc"
[guard]
%s
dnsmasq_user = "65534"
verify_interval = "2s"
node_root = %q
state_dir = %q
[metrics]
listen = "0.0.0.0:%d"
[lockdown]
marker = %q
resolver = %q
backup_dir = %q
state_file = %q
[halt]
state_file = %q
`, guard, b.NodeRoot(), filepath.Join(dir, "state"), accMetricsPort, filepath.Join(dir, "marker"), b.ResolvConf(),
		filepath.Join(dir, "lockdown"), filepath.Join(dir, "lockdown.json"), filepath.Join(dir, "halted"))
	if err := os.WriteFile(cfg, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// daemonProc is a `pve-inspectd run` process in the node namespace.
type daemonProc struct {
	cmd  *exec.Cmd
	done chan error
}

// startDaemon runs the daemon and returns once it logged "ready".
func (a *accBed) startDaemon(t *testing.T, ctx context.Context) *daemonProc {
	t.Helper()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", a.b.NodeNS(), os.Args[0], "run", "-c", a.cfg)
	cmd.Env = append(os.Environ(), "PVE_INSPECTD_TEST_AS_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemonProc{cmd: cmd, done: make(chan error, 1)}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		said := false
		for sc.Scan() {
			if !said && strings.Contains(sc.Text(), "msg=ready") {
				said = true
				ready <- true
			}
		}
		if !said {
			ready <- false
		}
		d.done <- cmd.Wait()
	}()
	t.Cleanup(func() { d.kill() })
	if !<-ready {
		t.Fatal("daemon exited before ready")
	}
	return d
}

func (d *daemonProc) kill() {
	if d.cmd.ProcessState == nil {
		_ = d.cmd.Process.Signal(syscall.SIGKILL)
	}
}

// nodeNFT runs nft in the node namespace (another process than the daemon).
func (a *accBed) nodeNFT(ctx context.Context, args ...string) (string, error) {
	out, err := a.b.Command(ctx, a.b.NodeNS(), append([]string{"nft"}, args...)...).CombinedOutput()
	return string(out), err
}

func (a *accBed) status(ctx context.Context) (string, int) {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", a.b.NodeNS(), os.Args[0], "status", "-c", a.cfg)
	cmd.Env = append(os.Environ(), "PVE_INSPECTD_TEST_AS_MAIN=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		return string(out) + err.Error(), -1
	}
	return string(out), 0
}

// probe is one connection attempt from guest A.
type probe struct {
	name string
	run  func() error
	// blocked: the attempt must time out (a refusal means a route exists).
	blocked bool
	// v6: an IPv6 target.
	v6 bool
}

// How long a probe waits. A row that must be reachable (a positive
// control) waits a minute: on a loaded machine a slow answer is still an
// answer, and a path the guard blocks never answers at all, so a broken
// control still fails. A row that must be blocked waits briefly for what
// must not come: what a missing rule lets through (an accept, a refusal,
// an HTTP answer) comes back within milliseconds, and a slow machine can
// only make such a row pass, never fail.
const (
	reachWithin = time.Minute
	blockWait   = 1500 * time.Millisecond
)

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// dial connects to addr from guest A, giving up after wait.
func (a *accBed) dial(addr string, wait time.Duration) func() error {
	return func() error {
		return a.b.Do(a.ga.NS, func() error {
			c, err := net.DialTimeout("tcp", addr, wait)
			if err != nil {
				return err
			}
			return c.Close()
		})
	}
}

// httpReq sends method to url from guest A on a connection dialled in its
// namespace; only blocked rows use it (blockWait).
func (a *accBed) httpReq(method, url string) func() error {
	return func() error {
		req, err := http.NewRequest(method, url, nil)
		if err != nil {
			return err
		}
		if method == http.MethodPut {
			req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", "60")
		}
		var conn net.Conn
		if err := a.b.Do(a.ga.NS, func() error {
			conn, err = net.DialTimeout("tcp", net.JoinHostPort(req.URL.Hostname(), "80"), blockWait)
			return err
		}); err != nil {
			return err
		}
		tr := &http.Transport{DisableKeepAlives: true, DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil }}
		resp, err := (&http.Client{Transport: tr, Timeout: 2 * blockWait}).Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
}

// dnsQuery asks the zone's resolver from guest A for name and wants an
// answer naming want; only positive controls use it (reachWithin).
func (a *accBed) dnsQuery(name, want string) func() error {
	return func() error {
		return a.b.Do(a.ga.NS, func() error {
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(name), dns.TypeA)
			r, _, err := (&dns.Client{Timeout: reachWithin}).Exchange(m, "10.10.1.1:53")
			if err != nil {
				return err
			}
			if len(r.Answer) == 0 || !strings.Contains(r.Answer[0].String(), want) {
				return fmt.Errorf("answer %v, want %s", r.Answer, want)
			}
			return nil
		})
	}
}

// dhcpRenew asks the zone's DHCP server for a lease from guest A's
// namespace (once, without touching the guest's configuration), giving up
// after reachWithin.
func (a *accBed) dhcpRenew(t *testing.T) func() error {
	dir := t.TempDir()
	cf := filepath.Join(dir, "dhclient.conf")
	_ = os.WriteFile(cf, fmt.Appendf(nil, "timeout %d;\n", int(reachWithin/time.Second)), 0o644)
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), reachWithin+30*time.Second)
		defer cancel()
		out, err := a.b.Command(ctx, a.ga.NS, "dhclient", "-4", "-1", "-cf", cf, "-sf", "/bin/true",
			"-lf", filepath.Join(dir, "leases"), "-pf", filepath.Join(dir, "pid"), "eth0").CombinedOutput()
		if err != nil {
			return fmt.Errorf("dhclient: %v: %s", err, out)
		}
		return nil
	}
}

func (a *accBed) probes(t *testing.T, withNATControls bool) []probe {
	var ps []probe
	block := func(name string, f func() error) {
		ps = append(ps, probe{name: name, run: f, blocked: true, v6: strings.Contains(name, "v6") || strings.Contains(name, "[")})
	}
	pass := func(name string, f func() error) { ps = append(ps, probe{name: name, run: f}) }
	for _, ip := range []string{testvm.MetadataAddr, testvm.AlibabaMDAddr, testvm.AzureWireAddr} {
		block("metadata GET "+ip, a.httpReq(http.MethodGet, "http://"+ip+"/latest/meta-data/instance-id"))
		block("metadata token PUT "+ip, a.httpReq(http.MethodPut, "http://"+ip+"/latest/api/token"))
	}
	block("metadata GET v6", a.httpReq(http.MethodGet, "http://["+testvm.MetadataAddr6+"]/latest/meta-data/instance-id"))
	block("metadata token PUT v6", a.httpReq(http.MethodPut, "http://["+testvm.MetadataAddr6+"]/latest/api/token"))
	block("AWS DNS tcp", a.dial(testvm.AWSDNSAddr+":53", blockWait))
	nodeAddrs := []string{"10.10.1.1", testvm.NodeMgmtAddr, "10.10.2.1", "[" + testvm.NodeMgmtAddr6 + "]"}
	for _, addr := range nodeAddrs {
		for _, port := range []int{8006, 22, 3128, accMetricsPort, accAPIPort} {
			block(fmt.Sprintf("node %s:%d", addr, port), a.dial(fmt.Sprintf("%s:%d", addr, port), blockWait))
		}
	}
	block("LAN host", a.dial(testvm.LANAddr+":80", blockWait))
	block("uplink neighbour (router's own address)", a.dial(testvm.UplinkAddr+":80", blockWait))
	block("guest B (other zone)", a.dial(a.gb.IPv4().String()+":80", blockWait))
	block("internet over IPv6 ["+testvm.InternetAddr6+"]", a.dial("["+testvm.InternetAddr6+"]:80", blockWait))
	pass("DHCP renewal", a.dhcpRenew(t))
	pass("zone DNS local name", a.dnsQuery(testvm.LocalName("zonea"), "10.10.1.1"))
	if withNATControls {
		pass("zone DNS recursion", a.dnsQuery(testvm.InternetName, testvm.InternetAddr))
		pass("internet :80", a.dial(testvm.InternetAddr+":80", reachWithin))
		pass("internet :443", a.dial(testvm.InternetAddr+":443", reachWithin))
	}
	return ps
}

// checkProbes runs every probe concurrently and reports each failure: a
// positive control that got no answer within reachWithin, a blocked row
// that got any answer but silence within blockWait.
func (a *accBed) checkProbes(t *testing.T, when string, withNATControls bool) {
	t.Helper()
	ps := a.probes(t, withNATControls)
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.run()
		}()
	}
	wg.Wait()
	for i, p := range ps {
		switch {
		case p.blocked && p.v6 && errors.Is(errs[i], syscall.EHOSTUNREACH):
			// The guest's own neighbour discovery for the node failed: the
			// input policy drops ICMPv6 from guests, so IPv6 packets never
			// even leave the guest. Blocked, and no route was proven.
		case p.blocked && !isTimeout(errs[i]):
			t.Errorf("%s: %s: want a timeout, got %v", when, p.name, errs[i])
		case !p.blocked && errs[i] != nil:
			t.Errorf("%s: %s (positive control): %v", when, p.name, errs[i])
		}
	}
}

// planRules is the rule count `pve-inspectd plan` renders for the bed.
func (a *accBed) planRules(ctx context.Context, t *testing.T) int {
	t.Helper()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", a.b.NodeNS(), os.Args[0], "plan", "-c", a.cfg)
	cmd.Env = append(os.Environ(), "PVE_INSPECTD_TEST_AS_MAIN=1")
	out, err := cmd.CombinedOutput()
	m := regexp.MustCompile(`ruleset \((\d+) rules`).FindSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

func (a *accBed) requireInForce(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	out, code := a.status(ctx)
	if code != 0 {
		t.Fatalf("%s: status exit %d:\n%s", when, code, out)
	}
	listing, err := a.nodeNFT(ctx, "list", "table", "inet", "pve-inspect")
	if err != nil {
		t.Fatalf("%s: list table: %v\n%s", when, err, listing)
	}
	if want := a.planRules(ctx, t); strings.Count(listing, "comment \"") != want {
		t.Errorf("%s: %d rules in the table, want %d as plan renders (duplicates or missing)", when, strings.Count(listing, "comment \""), want)
	}
}

// TestAcceptanceGuardOnBed runs the daemon on the bed and probes guest A's
// containment while it runs, in the gap after a kill -9, after a rebuild
// and after a ruleset flush: every blocked row silent, every positive
// control answered. A slow machine cannot fail a row: a control gets a
// minute (a path the guard blocks never answers), and a blocked row fails
// only on an answer, which a missing rule lets through at once
// (checkProbes).
func TestAcceptanceGuardOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	a := upAccBed(t, ctx)
	top := t // daemons outlive the subtest that starts them
	d := a.startDaemon(t, ctx)
	a.requireInForce(t, ctx, "running")
	a.checkProbes(t, "running", true)
	// each kind of probe was stopped by the rule meant for it. (IPv6
	// probes are stopped earlier: the input policy drops the guest's
	// neighbour solicitations for the node, so no IPv6 packet is ever
	// forwarded and metadata6/ipv6 stay at zero.)
	out, _ := a.status(ctx)
	// (the guests' lease requests are broadcasts: guest-dhcp-broadcast;
	// guest-dhcp takes renewals, unicast to the zone's own address)
	for _, r := range []string{"metadata4", "cross-zone", "private4", "uplink-subnet", "guest-input-drop", "guest-dhcp-broadcast", "guest-dns-udp"} {
		re := regexp.MustCompile(`(?m)^\s+\S+\s+` + regexp.QuoteMeta(r) + `\s+(\d+)/`)
		m := re.FindStringSubmatch(out)
		if m == nil || m[1] == "0" {
			t.Errorf("rule %s counted no packets after the probes:\n%s", r, out)
		}
	}

	t.Run("tamper while running is refused", func(t *testing.T) {
		if out, err := a.nodeNFT(ctx, "delete", "table", "inet", "pve-inspect"); err == nil || !strings.Contains(out, "Operation not permitted") {
			t.Errorf("nft delete table: %v %s, want EPERM", err, out)
		}
		a.requireInForce(t, ctx, "after delete attempt")
	})

	t.Run("default route moves, mgmt set follows", func(t *testing.T) {
		if err := a.b.AddSecondUplink(ctx); err != nil {
			t.Fatal(err)
		}
		if err := a.b.SetDefaultRoute(ctx, testvm.NodeMgmtIface2); err != nil {
			t.Fatal(err)
		}
		waitSet(t, ctx, a, "mgmt", `"mgmt0", "mgmt1"`, `"mgmt1"`)
		if err := a.b.SetDefaultRoute(ctx, testvm.NodeMgmtIface); err != nil {
			t.Fatal(err)
		}
		waitSet(t, ctx, a, "mgmt", `"mgmt0"`)
		a.requireInForce(t, ctx, "after route moves")
	})

	t.Run("kill -9, gap, restart re-adopts", func(t *testing.T) {
		d.kill()
		<-d.done
		out, code := a.status(ctx)
		if code == 0 || !strings.Contains(out, "ORPHANED") {
			t.Errorf("status during the gap: exit %d\n%s", code, out)
		}
		a.checkProbes(t, "gap after kill -9", true)
		d = a.startDaemon(top, ctx)
		a.requireInForce(t, ctx, "after restart")
	})

	t.Run("deleted while down, rebuilt before ready", func(t *testing.T) {
		d.kill()
		<-d.done
		if out, err := a.nodeNFT(ctx, "delete", "table", "inet", "pve-inspect"); err != nil {
			t.Fatalf("delete orphan: %v %s", err, out)
		}
		d = a.startDaemon(top, ctx)
		a.requireInForce(t, ctx, "right after ready")
		a.checkProbes(t, "after rebuild", true)
	})

	// Last: a ruleset flush also wipes the bed's own NAT, so the controls
	// that need SNAT cannot run afterwards.
	t.Run("nft flush ruleset skips the owned table", func(t *testing.T) {
		out, err := a.nodeNFT(ctx, "flush", "ruleset")
		t.Logf("nft flush ruleset: err=%v %s", err, out)
		a.requireInForce(t, ctx, "after flush ruleset")
		a.checkProbes(t, "after flush ruleset", false)
	})
}

// waitSet waits until the named set lists exactly one of want.
func waitSet(t *testing.T, ctx context.Context, a *accBed, set string, want ...string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last string
	for time.Now().Before(deadline) {
		out, err := a.nodeNFT(ctx, "list", "set", "inet", "pve-inspect", set)
		if err == nil {
			i := strings.Index(out, "elements = {")
			last = ""
			if i >= 0 {
				j := strings.Index(out[i:], "}")
				last = strings.Join(strings.Fields(out[i+len("elements = {"):i+j]), " ")
			}
			for _, w := range want {
				if last == w {
					return
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("set %s = %q, want one of %q", set, last, want)
}
