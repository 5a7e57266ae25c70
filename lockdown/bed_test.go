package lockdown

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/portmap"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/lockdown/halt"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// The real host guard and halt are what the controller drives in
// production.
var (
	_ Guard  = (*firewall.Guard)(nil)
	_ Halter = (*halt.Halter)(nil)
)

// TestLockdownOnBed is the acceptance test of issue 4 on the node in a
// box: the real guard (nftables in the node namespace), the real zone
// dnsmasq, real guests; only the halt is a recording stand-in (the systemd
// side is tested in lockdown/halt).
func TestLockdownOnBed(t *testing.T) {
	testkit.RequireRoot(t, "dnsmasq")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	va := testvm.VNet{Name: "vneta", Subnet: netip.MustParsePrefix("10.10.1.0/24"), Gateway: netip.MustParseAddr("10.10.1.1"),
		DHCP: []testvm.DHCPRange{{Start: netip.MustParseAddr("10.10.1.100"), End: netip.MustParseAddr("10.10.1.200")}}, SNAT: true}
	vb := testvm.VNet{Name: "vnetb", Subnet: netip.MustParsePrefix("10.10.2.0/24"), Gateway: netip.MustParseAddr("10.10.2.1"),
		DHCP: []testvm.DHCPRange{{Start: netip.MustParseAddr("10.10.2.100"), End: netip.MustParseAddr("10.10.2.200")}}, SNAT: true}
	if err := b.AddZone(ctx, testvm.Zone{ID: "zonea", VNets: []testvm.VNet{va, vb}}); err != nil {
		t.Fatal(err)
	}
	ga, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 101, VNet: "vneta"})
	if err != nil {
		t.Fatal(err)
	}
	origResolver, err := os.ReadFile(b.ResolvConf())
	if err != nil {
		t.Fatal(err)
	}

	// The host guard in the node namespace, running (route events).
	node, err := netns.GetFromName(b.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	g, err := firewall.New(firewall.Config{DnsmasqUser: "dnsmasq", ProcRoot: t.TempDir(), StateDir: t.TempDir(),
		Zones: map[string][]string{"zonea": {"vneta", "vnetb"}}}, firewall.WithNetNS(node))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	guardDone, ctrlDone, mapDone := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	defer func() { stop(); <-guardDone; <-ctrlDone; <-mapDone }()
	go func() { guardDone <- g.Run(runCtx) }()
	// the layer-2 guard's port map, from the bed's VM configs and leases
	mapper := &portmap.Mapper{Paths: portmap.Paths{Root: b.NodeRoot()}, Guard: g, Interval: 200 * time.Millisecond}
	if _, err := mapper.Once(ctx); err != nil {
		t.Fatal(err)
	}
	go func() { mapDone <- mapper.Run(runCtx) }()

	// The controller on the bed's resolver file; only this bed's zone
	// dnsmasq names it on its command line.
	dir := t.TempDir()
	marker := filepath.Join(mkdir(t, dir, "etc"), "inspect-proxmox-egress-lockdown")
	halter := &fakeHalter{}
	reg := prometheus.NewRegistry()
	met, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{
		Marker: marker, Resolver: b.ResolvConf(), BackupDir: mkdir(t, dir, "run"), StateFile: filepath.Join(dir, "run", "lockdown.json"),
		Reassert: 2 * time.Second, Guard: g, Halter: halter, Metrics: met,
		Reloader: ProcSignaler{Matcher: DnsmasqMatcher{Exe: "dnsmasq", CmdlineContains: []string{b.ResolvConf()}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() { ctrlDone <- c.Run(runCtx) }()
	e := &env{t: t, ctrl: c}
	e.waitFor("first reconcile", func(s State) bool { return !s.Updated.IsZero() })

	// Probes from the guest.
	dial := func(ns, addr string) error {
		return b.Do(ns, func() error {
			conn, err := net.DialTimeout("tcp", addr, 1500*time.Millisecond)
			if err == nil {
				conn.Close()
			}
			return err
		})
	}
	timesOut := func(err error) bool {
		var ne net.Error
		return errors.As(err, &ne) && ne.Timeout()
	}
	// query asks the zone resolver over UDP and, like a stub resolver,
	// asks again when no answer comes (a datagram lost while dnsmasq
	// handles a reload under load); a reply of any kind ends it.
	query := func(name string) (*dns.Msg, error) {
		var resp *dns.Msg
		var err error
		for attempt := 0; attempt < 3; attempt++ {
			err = b.Do(ga.NS, func() error {
				m := new(dns.Msg)
				m.SetQuestion(dns.Fqdn(name), dns.TypeA)
				var err error
				resp, _, err = (&dns.Client{Timeout: 3 * time.Second}).Exchange(m, va.Gateway.String()+":53")
				return err
			})
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				break
			}
		}
		return resp, err
	}
	fresh := func() string { // never cached: only the upstream answers it
		r := make([]byte, 4)
		_, _ = rand.Read(r)
		return "x" + hex.EncodeToString(r) + "." + testvm.InternetName
	}
	expectOpen := func(when string) {
		t.Helper()
		for _, addr := range []string{testvm.InternetAddr + ":80", testvm.InternetAddr + ":443"} {
			if err := dial(ga.NS, addr); err != nil {
				t.Errorf("%s: %s from the guest: %v", when, addr, err)
			}
		}
		for _, name := range []string{testvm.InternetName, fresh()} {
			resp, err := query(name)
			if err != nil || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0 {
				t.Errorf("%s: %s through the zone resolver: %v %v", when, name, err, resp)
			}
		}
	}
	expectLocked := func(when string) {
		t.Helper()
		// Positive control first: the zone resolver answers local names.
		resp, err := query(testvm.LocalName("zonea"))
		if err != nil || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0 {
			t.Fatalf("%s: positive control %s: %v %v", when, testvm.LocalName("zonea"), err, resp)
		}
		for _, addr := range []string{testvm.InternetAddr + ":80", testvm.InternetAddr + ":443"} {
			if err := dial(ga.NS, addr); !timesOut(err) {
				t.Errorf("%s: %s from the guest: want a timeout, got %v", when, addr, err)
			}
		}
		// It answers, it just does not recurse: REFUSED and no answer,
		// for the cached name too (dnsmasq's cache was cleared).
		for _, name := range []string{testvm.InternetName, fresh()} {
			resp, err := query(name)
			if err != nil {
				t.Errorf("%s: %s: the zone resolver did not answer: %v", when, name, err)
				continue
			}
			if resp.Rcode != dns.RcodeRefused || len(resp.Answer) != 0 {
				t.Errorf("%s: %s = %s with %d answers, want REFUSED and none", when, name, dns.RcodeToString[resp.Rcode], len(resp.Answer))
			}
		}
	}

	expectOpen("before the lockdown")

	if err := SetMarker(marker, true); err != nil {
		t.Fatal(err)
	}
	e.waitFor("enforced", enforced)
	expectLocked("marker created")
	// DHCP still works: a guest started now gets its lease (StartGuest
	// returns only then).
	gb, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 102, VNet: "vnetb"})
	if err != nil {
		t.Fatalf("DHCP during the lockdown: %v", err)
	}

	// Something rewrites the resolver file: blanked again, still no
	// recursion.
	rewritten := time.Now().UTC()
	if err := os.WriteFile(b.ResolvConf(), origResolver, 0o644); err != nil {
		t.Fatal(err)
	}
	e.waitFor("re-blanked", func(s State) bool {
		cur, _ := os.ReadFile(b.ResolvConf())
		return s.Updated.After(rewritten) && enforced(s) && bytes.Equal(cur, BlankContent(marker))
	})
	expectLocked("after a rewrite of the resolver file")

	// Guest to guest across the zone's vnets is routed by the node and
	// works under the lockdown; with the default route gone the blanket
	// drop cuts it too and the node halts.
	ln, err := listenIn(b, gb.NS, ":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	g2g := gb.IPv4().String() + ":8080"
	if err := dial(ga.NS, g2g); err != nil {
		t.Fatalf("guest to guest under the lockdown (positive control): %v", err)
	}
	if err := b.SetDefaultRoute(ctx, ""); err != nil {
		t.Fatal(err)
	}
	s := e.waitFor("fail closed", func(s State) bool { return s.Marker && s.FailClosed && s.Halted != "" })
	if s.Enforced || s.Halted != ReasonNoDefaultRoute {
		t.Errorf("state %+v: want not enforced, halted for %s", s, ReasonNoDefaultRoute)
	}
	if err := dial(ga.NS, g2g); !timesOut(err) {
		t.Errorf("guest to guest with no default route: want a timeout, got %v", err)
	}
	if got := halter.got(); len(got) == 0 || got[0] != ReasonNoDefaultRoute {
		t.Errorf("halts %v, want %s", got, ReasonNoDefaultRoute)
	}
	if testutil.ToFloat64(met.failClosed) != 1 || testutil.ToFloat64(met.enforced) != 0 || testutil.ToFloat64(met.enabled) != 1 {
		t.Errorf("metrics: fail_closed %v enforced %v enabled %v, want 1 0 1",
			testutil.ToFloat64(met.failClosed), testutil.ToFloat64(met.enforced), testutil.ToFloat64(met.enabled))
	}

	// The route comes back: enforced again, the blanket drop off.
	if err := b.SetDefaultRoute(ctx, testvm.NodeMgmtIface); err != nil {
		t.Fatal(err)
	}
	e.waitFor("enforced after the route returned", func(s State) bool { return enforced(s) && !s.FailClosed })
	if err := dial(ga.NS, g2g); err != nil {
		t.Errorf("guest to guest after the route returned: %v", err)
	}
	expectLocked("route returned")

	// Marker removed: everything back, the file byte-identical.
	if err := SetMarker(marker, false); err != nil {
		t.Fatal(err)
	}
	e.waitFor("lifted", lifted)
	cur, err := os.ReadFile(b.ResolvConf())
	if err != nil || !bytes.Equal(cur, origResolver) {
		t.Errorf("resolver after lift = %q (%v), want byte-identical %q", cur, err, origResolver)
	}
	expectOpen("marker removed")
	if n := histCount(t, reg, "pve_inspect_lockdown_marker_to_enforced_seconds"); n != 1 {
		t.Errorf("latency samples = %d, want 1", n)
	}
	for _, f := range []string{backupRecordName, backupContentName} {
		if _, err := os.Stat(filepath.Join(dir, "run", f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("backup %s left behind (err %v)", f, err)
		}
	}

	// Bursts of flips on the real guard end in the final marker state: 201
	// flips end locked, 200 more end lifted, with nothing of ours left.
	for _, n := range []int{201, 200} {
		for i := 0; i < n; i++ {
			if err := SetMarker(marker, i%2 == 0); err != nil {
				t.Fatal(err)
			}
		}
		end := time.Now()
		after := func(cond func(State) bool) func(State) bool {
			return func(s State) bool { return s.Updated.After(end) && cond(s) }
		}
		if n%2 == 1 {
			e.waitFor("locked after a burst", after(enforced))
			expectLocked(fmt.Sprintf("after a burst of %d flips", n))
			continue
		}
		e.waitFor("lifted after a burst", after(lifted))
		expectOpen(fmt.Sprintf("after a burst of %d flips", n))
	}
	if sw := g.Switches(); sw.Lockdown || sw.FailClosed {
		t.Errorf("guard switches after the bursts: %+v", sw)
	}
	out, err := b.Command(ctx, b.NodeNS(), "nft", "list", "set", "inet", "pve-inspect", "lockdown").CombinedOutput()
	if err != nil || strings.Contains(string(out), "elements") {
		t.Errorf("lockdown set after the bursts (want empty): %v\n%s", err, out)
	}
	if cur, err := os.ReadFile(b.ResolvConf()); err != nil || !bytes.Equal(cur, origResolver) {
		t.Errorf("resolver after the bursts = %q (%v), want byte-identical %q", cur, err, origResolver)
	}
	for _, f := range []string{backupRecordName, backupContentName} {
		if _, err := os.Stat(filepath.Join(dir, "run", f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("backup %s left behind after the bursts (err %v)", f, err)
		}
	}
}

// listenIn opens a TCP listener in netns ns that accepts and closes.
func listenIn(b *testvm.Bed, ns, addr string) (net.Listener, error) {
	var ln net.Listener
	err := b.Do(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen in %s: %w", ns, err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln, nil
}
