package firewall

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// bedPorts is the layer-2 guard's port map of bed guests (what
// firewall/portmap reads from a node's files): tap<vmid>i0, the guest's
// MAC and its DHCP address.
func bedPorts(guests ...*testvm.Guest) []Port {
	var out []Port
	for _, g := range guests {
		out = append(out, Port{Name: PortNames(g.VMID, 0)[0], MAC: g.MAC, IPv4: []netip.Addr{g.IPv4()}})
	}
	return out
}

// TestSwitchesOnBed checks with real traffic that the inert rules work
// when switched: lockdown cuts guest egress and the SDN resolver's
// upstream, fail-closed cuts all forwarding, and both come back off.
func TestSwitchesOnBed(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	v := testvm.VNet{Name: "vneta", Subnet: netip.MustParsePrefix("10.10.1.0/24"), Gateway: netip.MustParseAddr("10.10.1.1"),
		DHCP: []testvm.DHCPRange{{Start: netip.MustParseAddr("10.10.1.100"), End: netip.MustParseAddr("10.10.1.200")}}, SNAT: true}
	if err := b.AddZone(ctx, testvm.Zone{ID: "zonea", VNets: []testvm.VNet{v}}); err != nil {
		t.Fatal(err)
	}
	ga, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 101, VNet: "vneta"})
	if err != nil {
		t.Fatal(err)
	}
	node, err := netns.GetFromName(b.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	cfg := Config{DnsmasqUser: "dnsmasq", ProcRoot: t.TempDir(), StateDir: t.TempDir()}
	g, err := New(cfg, WithNetNS(node))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if len(g.Desired().Notes) != 0 {
		t.Fatalf("the dnsmasq rule is missing: %v", g.Desired().Notes)
	}

	// what must work gets a minute (a loaded machine is slow), what must
	// not is given up after a few seconds
	within := func(ok bool, short time.Duration) time.Duration {
		if ok {
			return time.Minute
		}
		return short
	}
	internet := func(d time.Duration) error {
		return b.Do(ga.NS, func() error {
			c, err := net.DialTimeout("tcp", testvm.InternetAddr+":80", d)
			if err == nil {
				c.Close()
			}
			return err
		})
	}
	// recursion asks the zone resolver for a fresh name (never cached),
	// which only the upstream "internet" resolver answers.
	recursion := func(d time.Duration) error {
		r := make([]byte, 4)
		_, _ = rand.Read(r)
		return b.Do(ga.NS, func() error {
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn("x"+hex.EncodeToString(r)+"."+testvm.InternetName), dns.TypeA)
			resp, _, err := (&dns.Client{Timeout: d}).Exchange(m, "10.10.1.1:53")
			if err != nil {
				return err
			}
			// cut upstream: dnsmasq's send fails (EPERM) and it answers
			// REFUSED, or SERVFAIL after a timeout
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0 {
				return fmt.Errorf("rcode %s, %d answers", dns.RcodeToString[resp.Rcode], len(resp.Answer))
			}
			return nil
		})
	}
	local := func() error {
		return b.Do(ga.NS, func() error {
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(testvm.LocalName("zonea")), dns.TypeA)
			resp, _, err := (&dns.Client{Timeout: time.Minute}).Exchange(m, "10.10.1.1:53")
			if err == nil && len(resp.Answer) == 0 {
				err = errors.New("no answer")
			}
			return err
		})
	}
	expect := func(when string, internetOK, recursionOK bool) {
		t.Helper()
		if err := local(); err != nil {
			t.Fatalf("%s: positive control, zone DNS local name: %v", when, err)
		}
		err := internet(within(internetOK, 1500*time.Millisecond))
		if internetOK && err != nil {
			t.Errorf("%s: internet: %v", when, err)
		}
		var ne net.Error
		if !internetOK && !(errors.As(err, &ne) && ne.Timeout()) {
			t.Errorf("%s: internet: want a timeout, got %v", when, err)
		}
		err = recursion(within(recursionOK, 4*time.Second))
		if recursionOK && err != nil {
			t.Errorf("%s: DNS recursion: %v", when, err)
		}
		if !recursionOK && err == nil {
			t.Errorf("%s: DNS recursion answered", when)
		}
	}

	expect("all off", true, true)
	if err := g.SetLockdown(ctx, true); err != nil {
		t.Fatal(err)
	}
	expect("lockdown on", false, false)
	if err := g.SetLockdown(ctx, false); err != nil {
		t.Fatal(err)
	}
	expect("lockdown off again", true, true)
	if err := g.SetFailClosed(ctx, true); err != nil {
		t.Fatal(err)
	}
	expect("fail-closed on", false, true)
	if err := g.SetFailClosed(ctx, false); err != nil {
		t.Fatal(err)
	}
	expect("fail-closed off again", true, true)

	st, err := Inspect(context.Background(), cfg, WithNetNS(node))
	if err != nil {
		t.Fatal(err)
	}
	hits := map[string]uint64{}
	for _, c := range st.Counters {
		hits[c.Rule] = c.Packets
	}
	for _, r := range []string{"lockdown-out", "dnsmasq-lockdown", "failclosed"} {
		if hits[r] == 0 {
			t.Errorf("rule %s counted nothing (counters kept across switches?): %v", r, hits)
		}
	}
	if err := g.Verify(ctx); err != nil {
		t.Error(err)
	}
}
