package firewall

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// egressBed is the bed of the egress tests: three zones with one guest
// each, the guard in force in the node namespace, a TCP service on the
// internet host's port 8080, and stand-ins for the daemon's resolver and
// proxy in the node (they answer with a marker, which proves a redirect).
type egressBed struct {
	b      *testvm.Bed
	g      *Guard
	guests map[string]*testvm.Guest // zone id -> its guest
}

const (
	stubResolverAnswer = "192.0.2.99"
	stubProxyGreeting  = "stub-proxy\n"
)

func newEgressBed(t *testing.T, ctx context.Context, cfg Config) *egressBed {
	t.Helper()
	testkit.RequireRoot(t)
	b, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	eb := &egressBed{b: b, guests: map[string]*testvm.Guest{}}
	zones := map[string][]string{}
	for i, id := range []string{"zonea", "zoneb", "zonec"} {
		vnet := "vnet" + id[len(id)-1:]
		n := byte(i + 1)
		v := testvm.VNet{Name: vnet, Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 10, n, 0}), 24),
			Gateway: netip.AddrFrom4([4]byte{10, 10, n, 1}),
			DHCP:    []testvm.DHCPRange{{Start: netip.AddrFrom4([4]byte{10, 10, n, 100}), End: netip.AddrFrom4([4]byte{10, 10, n, 200})}}, SNAT: true}
		if err := b.AddZone(ctx, testvm.Zone{ID: id, VNets: []testvm.VNet{v}}); err != nil {
			t.Fatal(err)
		}
		gs, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 101 + i, VNet: vnet})
		if err != nil {
			t.Fatal(err)
		}
		eb.guests[id] = gs
		zones[id] = []string{vnet}
	}
	node, err := netns.GetFromName(b.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	cfg.DnsmasqUser, cfg.ProcRoot, cfg.StateDir = "dnsmasq", t.TempDir(), t.TempDir()
	g, err := New(cfg, WithNetNS(node))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	var guests []*testvm.Guest
	for _, gs := range eb.guests {
		guests = append(guests, gs)
	}
	if err := g.SetPorts(ctx, bedPorts(guests...)); err != nil { // the layer-2 guard's port map
		t.Fatal(err)
	}
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.SetZones(ctx, zones); err != nil {
		t.Fatal(err)
	}
	// the layer-2 table lets a zone's guest port send only DHCP until it
	// is mapped to its MAC and leased address
	var ports []Port
	for _, gs := range eb.guests {
		ports = append(ports, Port{Name: fmt.Sprintf("tap%di0", gs.VMID), MAC: gs.MAC, IPv4: []netip.Addr{gs.IPv4()}})
	}
	if err := g.SetPorts(ctx, ports); err != nil {
		t.Fatal(err)
	}
	eb.g = g
	dnsPort, proxyPort := cfg.Egress.Ports()
	eb.listen(t, b.UplinkNS(), testvm.InternetAddr+":8080", "internet-8080\n")
	eb.listen(t, b.NodeNS(), fmt.Sprintf(":%d", proxyPort), stubProxyGreeting)
	var pc net.PacketConn
	if err := b.Do(b.NodeNS(), func() (err error) {
		pc, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", dnsPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5},
			A: net.ParseIP(stubResolverAnswer)}}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return eb
}

// listen serves greeting on every TCP connection to addr inside ns.
func (eb *egressBed) listen(t *testing.T, ns, addr, greeting string) {
	t.Helper()
	var ln net.Listener
	if err := eb.b.Do(ns, func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, greeting)
			_ = c.Close()
		}
	}()
}

// read connects from zone's guest to addr and returns the first line,
// giving up on the connection and on the reading after d each.
func (eb *egressBed) read(zone, addr string, d time.Duration) (string, error) {
	var got string
	err := eb.b.Do(eb.guests[zone].NS, func() error {
		c, err := net.DialTimeout("tcp4", addr, d)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(d))
		b, err := io.ReadAll(io.LimitReader(c, 256))
		got = string(b)
		return err
	})
	return got, err
}

// reachable asserts that zone's guest reaches addr and reads want, or
// (want == "") that the connection times out: a drop, not a refusal.
func (eb *egressBed) expect(t *testing.T, when, zone, addr, want string) {
	t.Helper()
	if want != "" {
		// what must work gets a minute (a loaded machine is slow)
		got, err := eb.read(zone, addr, time.Minute)
		if err != nil || got != want {
			t.Errorf("%s: %s -> %s: got %q, %v; want %q", when, zone, addr, got, err, want)
		}
		return
	}
	got, err := eb.read(zone, addr, 1500*time.Millisecond)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("%s: %s -> %s: want a timeout (dropped), got %q, %v", when, zone, addr, got, err)
	}
}

// resolve asks server from zone's guest for example.test and returns the
// first A record.
func (eb *egressBed) resolve(zone, server string) (string, error) {
	var got string
	err := eb.b.Do(eb.guests[zone].NS, func() error {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(testvm.InternetName), dns.TypeA)
		resp, _, err := (&dns.Client{Timeout: time.Minute}).Exchange(m, server)
		if err != nil {
			return err
		}
		for _, rr := range resp.Answer {
			if a, ok := rr.(*dns.A); ok {
				got = a.A.String()
				return nil
			}
		}
		return fmt.Errorf("no A record (rcode %s)", dns.RcodeToString[resp.Rcode])
	})
	return got, err
}

// TestEgressPoliciesOnBed checks with real traffic the kernel side of the
// egress policies: allowlist, none and open zones side by side, deny
// CIDRs, a change in force when SetEgress returns, learned addresses and
// their expiry, the DNS and peek redirects, and the lockdown winning over
// every policy.
func TestEgressPoliciesOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	eb := newEgressBed(t, ctx, Config{})
	inet80, inet8080 := testvm.InternetAddr+":80", testvm.InternetAddr+":8080"
	set := func(a, b, c ZoneEgress) {
		t.Helper()
		a.Bridges, b.Bridges, c.Bridges = []string{"vneta"}, []string{"vnetb"}, []string{"vnetc"}
		if err := eb.g.SetEgress(ctx, map[string]ZoneEgress{"zonea": a, "zoneb": b, "zonec": c}); err != nil {
			t.Fatal(err)
		}
	}
	inetHost := netip.MustParsePrefix(testvm.InternetAddr + "/32")
	allowInet := ZoneEgress{Mode: EgressAllowlist, Allow: []netip.Prefix{inetHost}}
	open := ZoneEgress{Mode: EgressOpen}

	// before any policy every zone is open (the default)
	for _, z := range []string{"zonea", "zoneb", "zonec"} {
		eb.expect(t, "default open", z, inet8080, "internet-8080\n")
	}
	// a zone under the node default (the daemon did not create it: a
	// reference plugin's) keeps its DNS path: its own dnsmasq answers
	if got, err := eb.resolve("zonec", "10.10.3.1:53"); err != nil || got != testvm.InternetAddr {
		t.Errorf("DNS of a default open zone to its gateway: got %q, %v; want the zone's dnsmasq's %q", got, err, testvm.InternetAddr)
	}
	set(allowInet, ZoneEgress{Mode: EgressNone}, open)
	eb.expect(t, "allowlist with the CIDR", "zonea", inet8080, "internet-8080\n")
	eb.expect(t, "none", "zoneb", inet8080, "")
	eb.expect(t, "open", "zonec", inet8080, "internet-8080\n")

	// the change is in force when SetEgress returns: no sleep, no retry
	set(ZoneEgress{Mode: EgressAllowlist}, ZoneEgress{Mode: EgressNone}, ZoneEgress{Mode: EgressOpen, Deny: []netip.Prefix{inetHost}})
	eb.expect(t, "allowlist without the CIDR", "zonea", inet8080, "")
	eb.expect(t, "open with the CIDR denied", "zonec", inet8080, "")

	// DNS from allowlist and none zones goes to the daemon's resolver
	// whatever server the guest picks; the daemon's own open zone's DNS
	// goes to it only when sent to the zone's own address (where its
	// dnsmasq listens: the resolver records it and asks that dnsmasq);
	// to any other server it is a flow like any other (firewall/egress
	// TestEgressOpenDNSRecordOnBed; here zonec denies the internet host)
	for _, tc := range []struct{ zone, server, want string }{
		{"zonea", testvm.InternetAddr + ":53", stubResolverAnswer},
		{"zonea", "10.10.1.1:53", stubResolverAnswer},
		{"zoneb", testvm.InternetAddr + ":53", stubResolverAnswer},
		{"zonec", "10.10.3.1:53", stubResolverAnswer},
	} {
		got, err := eb.resolve(tc.zone, tc.server)
		if err != nil || got != tc.want {
			t.Errorf("DNS %s -> %s: got %q, %v; want %q", tc.zone, tc.server, got, err, tc.want)
		}
	}

	// a learned address opens for its zone only; tcp 80/443 to it goes
	// to the peek proxy, and nothing else (issue 24, the main finding:
	// it used to open every port); a learned port opens that port by
	// address; both expire with their timeout (learnFor: long enough
	// for the checks while learned on a loaded machine, short enough to
	// wait for the expiry)
	const learnFor = 20 * time.Second
	if skipped, err := eb.g.Learn(ctx, "vneta", []netip.Addr{netip.MustParseAddr(testvm.InternetAddr),
		netip.MustParseAddr(testvm.MetadataAddr), netip.MustParseAddr(testvm.LANAddr)}, learnFor); err != nil || len(skipped) != 2 {
		t.Fatalf("learn: skipped %v, %v; want the metadata and LAN addresses skipped", skipped, err)
	}
	eb.expect(t, "learned for the name check only", "zonea", inet8080, "")
	eb.expect(t, "learned, tcp 80 peeked", "zonea", inet80, stubProxyGreeting)
	if skipped, err := eb.g.LearnOpen(ctx, "vneta", []netip.Addr{netip.MustParseAddr(testvm.InternetAddr),
		netip.MustParseAddr(testvm.MetadataAddr)}, Opening{Ports: []uint16{8080}}, learnFor); err != nil || len(skipped) != 1 {
		t.Fatalf("learn port 8080: skipped %v, %v; want the metadata address skipped", skipped, err)
	}
	eb.expect(t, "learned", "zonea", inet8080, "internet-8080\n")
	eb.expect(t, "learned by another zone", "zoneb", inet8080, "")
	deadline := time.Now().Add(learnFor + time.Minute)
	for {
		if _, err := eb.read("zonea", inet8080, 1500*time.Millisecond); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("learned address never expired")
		}
		time.Sleep(500 * time.Millisecond)
	}
	if _, err := eb.g.LearnOpen(ctx, "vneta", []netip.Addr{netip.MustParseAddr(testvm.InternetAddr)}, Opening{Checked: true, Ports: []uint16{8080}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	eb.expect(t, "learned again", "zonea", inet8080, "internet-8080\n")
	// a restarted daemon reads them back to count them against their owner
	kept, err := eb.g.LearnedElements(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inet := netip.MustParseAddr(testvm.InternetAddr)
	var ports []uint16
	for _, k := range kept {
		if k.Iface != "vneta" || k.Addr != inet || k.Expires <= 0 || k.Expires > time.Minute {
			t.Errorf("learned element %+v, want vneta %s expiring within a minute", k, inet)
		}
		ports = append(ports, k.Port)
	}
	if slices.Sort(ports); !slices.Equal(ports, []uint16{0, 8080}) {
		t.Errorf("learned elements' ports %v, want [0 8080] (the name-checked address and its 8080)", ports)
	}
	if err := eb.g.Forget(ctx, []string{"vneta"}); err != nil {
		t.Fatal(err)
	}
	eb.expect(t, "forgotten", "zonea", inet8080, "")
	eb.expect(t, "forgotten, tcp 80 no longer peeked", "zonea", inet80, "")
	if _, err := eb.g.Learn(ctx, testvm.NodeMgmtIface, []netip.Addr{netip.MustParseAddr(testvm.InternetAddr)}, time.Minute); !errors.Is(err, ErrNotGuest) {
		t.Errorf("learn for the management interface: %v, want ErrNotGuest", err)
	}

	// the lockdown wins over every policy
	set(allowInet, ZoneEgress{Mode: EgressNone}, open)
	if err := eb.g.SetLockdown(ctx, true); err != nil {
		t.Fatal(err)
	}
	for _, z := range []string{"zonea", "zoneb", "zonec"} {
		eb.expect(t, "lockdown", z, inet8080, "")
	}
	if err := eb.g.SetLockdown(ctx, false); err != nil {
		t.Fatal(err)
	}
	eb.expect(t, "lockdown off", "zonea", inet8080, "internet-8080\n")
	eb.expect(t, "lockdown off", "zonec", inet8080, "internet-8080\n")
	if err := eb.g.Verify(ctx); err != nil {
		t.Error(err)
	}
}

// TestEgressDefaultOnBed: a zone the daemon did not create (no SetEgress
// entry) gets the configured default; the daemon's own zones keep theirs.
func TestEgressDefaultOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	eb := newEgressBed(t, ctx, Config{Egress: EgressConfig{Default: ZoneEgress{Mode: EgressNone}}})
	inet8080 := testvm.InternetAddr + ":8080"
	if err := eb.g.SetEgress(ctx, map[string]ZoneEgress{"zonec": {Mode: EgressOpen, Bridges: []string{"vnetc"}}}); err != nil {
		t.Fatal(err)
	}
	eb.expect(t, "default none", "zonea", inet8080, "")
	eb.expect(t, "default none", "zoneb", inet8080, "")
	eb.expect(t, "own open policy", "zonec", inet8080, "internet-8080\n")
	if got, err := eb.resolve("zonea", testvm.InternetAddr+":53"); err != nil || got != stubResolverAnswer {
		t.Errorf("DNS from a default-none zone: %q, %v; want the daemon's resolver", got, err)
	}
}

// TestEgressKeptAcrossRestart: a guard started with the persisted
// policies (WithEgress) adopts the orphaned table with them in force,
// never opening the zone to the default in between; the learned set's
// members survive the adoption.
func TestEgressKeptAcrossRestart(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	cfg.Egress.Default = ZoneEgress{Mode: EgressOpen}
	pol := map[string]ZoneEgress{"z": {Bridges: []string{"vnetA"}, Mode: EgressNone},
		"y": {Bridges: []string{"vnetB"}, Mode: EgressAllowlist, Allow: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}}
	ctx := context.Background()
	g1, err := New(cfg, WithNetNS(n.Handle()), WithEgress(pol))
	if err != nil {
		t.Fatal(err)
	}
	if err := g1.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := g1.Learn(ctx, "vnetB", []netip.Addr{netip.MustParseAddr("198.51.100.7")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := g1.Close(); err != nil {
		t.Fatal(err)
	}
	expires := regexp.MustCompile(` expires \S+`)
	before := expires.ReplaceAllString(listTable(t, n), "")
	g2 := func() *Guard {
		g, err := New(cfg, WithNetNS(n.Handle()), WithEgress(pol))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		if err := g.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return g
	}()
	if got := setElements(t, n, SetEgressNone); got != `"vnetA"` {
		t.Errorf("egress_none after restart: %s", got)
	}
	if got := setElements(t, n, SetEgressLearned4); !strings.Contains(got, "198.51.100.7") {
		t.Errorf("learned set after restart: %s", got)
	}
	if after := expires.ReplaceAllString(listTable(t, n), ""); after != before {
		t.Errorf("adoption changed the table:\n%s\nwant\n%s", after, before)
	}
	if _, err := New(cfg, WithNetNS(n.Handle()), WithEgress(map[string]ZoneEgress{"z": {Mode: "closed"}})); err == nil {
		t.Error("New accepted a bad egress policy")
	}
	if err := g2.Verify(ctx); err != nil {
		t.Error(err)
	}
}

// TestGuestDHCPInputOwnBridgeOnBed is issue 24 finding 7: the input rule
// for DHCP accepted udp 67-68 to every node address, so a guest reached
// another zone's dnsmasq and the management address on those ports. Now
// only an address of the bridge the packet came in on (and the limited
// broadcast, for clients without a lease) takes DHCP. Seen through the
// input chain's final drop counter (dport 68 from a guest never leaves
// its port: the layer-2 guard drops it). On the old code the datagrams to
// zone b's gateway and to the management address are accepted.
func TestGuestDHCPInputOwnBridgeOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	eb := newEgressBed(t, ctx, Config{})
	packets := regexp.MustCompile(`packets (\d+) .*comment "guest-input-drop"`)
	dropped := func() uint64 {
		t.Helper()
		out, err := eb.b.Command(ctx, eb.b.NodeNS(), "nft", "list", "chain", "inet", TableName, chainGuestIn).CombinedOutput()
		if err != nil {
			t.Fatalf("list guest_in: %v: %s", err, out)
		}
		m := packets.FindSubmatch(out)
		if m == nil {
			t.Fatalf("no guest-input-drop counter in:\n%s", out)
		}
		n, err := strconv.ParseUint(string(m[1]), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tc := range []struct {
		to   string
		drop bool
	}{
		{"10.10.1.1", false}, // zonea's own gateway (a renewal's path)
		{"10.10.2.1", true},  // zone b's dnsmasq
		{testvm.NodeMgmtAddr, true},
	} {
		before := dropped()
		if err := eb.b.Do(eb.guests["zonea"].NS, func() error {
			c, err := net.Dial("udp4", tc.to+":67")
			if err != nil {
				return err
			}
			defer c.Close()
			// a well-formed request (no relay address, no ciaddr), so
			// that only the own-bridge rule decides
			_, err = c.Write(dhcpRelayed(net.HardwareAddr{2, 0, 0, 0, 0, 1}, netip.IPv4Unspecified(), 1))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		// a drop is counted once the datagram went through the node's
		// stack, later on a loaded machine: wait for it; a pass is
		// given a moment to be miscounted
		if tc.drop {
			deadline := time.Now().Add(time.Minute)
			for dropped() == before && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
		} else {
			time.Sleep(200 * time.Millisecond)
		}
		if got := dropped() > before; got != tc.drop {
			t.Errorf("udp 67 from zonea's guest to %s: dropped=%v, want %v", tc.to, got, tc.drop)
		}
	}
}
