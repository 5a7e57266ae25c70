package firewall

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// floodGuest is a namespace standing in for a guest: its eth0 is the peer
// of a tap port of a zone bridge in the node namespace.
type floodGuest struct {
	ns   *testkit.NetNS
	addr netip.Addr
	mac  net.HardwareAddr
	port string
}

// plugGuest adds a guest namespace whose eth0 (addr/24, default route via
// gw) is the peer of port, enslaved to bridge in n.
func plugGuest(t *testing.T, n *testNS, port, bridge, addr, gw string) *floodGuest {
	t.Helper()
	g := &floodGuest{ns: testkit.NewNetNS(t, "pgf"), addr: netip.MustParseAddr(addr), port: port}
	br, err := n.Netlink().LinkByName(bridge)
	if err != nil {
		t.Fatal(err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port, MasterIndex: br.Attrs().Index},
		PeerName: "eth0", PeerNamespace: netlink.NsFd(int(g.ns.Handle()))}
	if err := n.Netlink().LinkAdd(veth); err != nil {
		t.Fatalf("add %s: %v", port, err)
	}
	n.IP(t, "link", "set", port, "up")
	g.ns.IP(t, "addr", "add", addr+"/24", "dev", "eth0")
	g.ns.IP(t, "link", "set", "eth0", "up")
	if gw != "" {
		g.ns.IP(t, "route", "add", "default", "via", gw)
	}
	l, err := g.ns.Netlink().LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	g.mac = l.Attrs().HardwareAddr
	return g
}

// conntrackLines returns the node namespace's conntrack entries that
// contain every one of subs (/proc/thread-self/net/nf_conntrack: the
// table as the namespace sees it).
func conntrackLines(t *testing.T, n *testNS, subs ...string) int {
	t.Helper()
	var b []byte
	if err := n.Do(func() (err error) {
		b, err = os.ReadFile("/proc/thread-self/net/nf_conntrack")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c := 0
lines:
	for _, l := range strings.Split(string(b), "\n") {
		for _, s := range subs {
			if !strings.Contains(l, s) {
				continue lines
			}
		}
		c++
	}
	return c
}

// counters sums the kernel's packet counters of the guard's rules in its
// three tables (inet, bridge, arp) by comment, as read now.
func counters(t *testing.T, n *testNS) map[string]uint64 {
	t.Helper()
	rd, err := openReader(buildOptions([]Option{WithNetNS(n.Handle())}))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	fams := []nftables.TableFamily{family, nftables.TableFamilyBridge, nftables.TableFamilyARP}
	// the counters are in the rules: no set's members are read
	ks, err := readKernelTables(rd, fams, func(nftables.TableFamily) func(string) bool {
		return func(string) bool { return false }
	})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, k := range ks {
		for _, rules := range k.rules {
			for _, r := range rules {
				for _, e := range r.Exprs {
					if c, ok := e.(*expr.Counter); ok {
						out[ruleComment(r)] += c.Packets
					}
				}
			}
		}
	}
	return out
}

// waitDropped waits until the counters of the drop rules named, summed,
// have grown by flood since before (a counters reading taken before the
// flood was sent): each packet of the flood is then handled, dropped by
// one of them, and what it could have made the node do is done or never
// will be. A rule counts a packet as its verdict is given, so this needs
// no ordering between the flood and anything else. A flood that never
// reaches the node, or that some other rule or none drops, fails here.
func waitDropped(t *testing.T, n *testNS, before map[string]uint64, flood uint64, rules ...string) {
	t.Helper()
	var got uint64
	defer func() {
		if got < flood { // eventually gave up
			t.Logf("%s dropped %d of the %d", strings.Join(rules, " and "), got, flood)
		}
	}()
	eventually(t, fmt.Sprintf("%d packets dropped by %s", flood, strings.Join(rules, " or ")), func() bool {
		now := counters(t, n)
		got = 0
		for _, r := range rules {
			got += now[r] - before[r]
		}
		return got >= flood
	})
}

// askDNS asks the resolver at server from inside ns and returns the
// round trip, or an error when no answer came within 10 s (a loaded
// machine is slow, a starved resolver never answers).
func askDNS(ns *testkit.NetNS, server string) (time.Duration, error) {
	var rtt time.Duration
	err := ns.Do(func() error {
		m := new(dns.Msg)
		m.SetQuestion("probe.test.", dns.TypeA)
		c := &dns.Client{Timeout: 10 * time.Second}
		r, d, err := c.Exchange(m, net.JoinHostPort(server, "53"))
		if err != nil {
			return err
		}
		if len(r.Answer) == 0 {
			return fmt.Errorf("no answer: %s", r)
		}
		rtt = d
		return nil
	})
	return rtt, err
}

// serveMgmt listens on addr in the node and greets every connection with
// "mgmt\n" (what connectMgmt expects), until the test ends.
func serveMgmt(t *testing.T, n *testNS, addr string) { serveGreeting(t, n.NetNS, addr) }

// connectMgmt connects from ns to addr, reads the greeting and returns
// the time it took; it gives up after a minute (a connection that must
// work; a loaded machine is slow).
func connectMgmt(ns *testkit.NetNS, addr string) (time.Duration, error) {
	return connectWithin(ns, addr, time.Minute)
}

// connectWithin is connectMgmt giving up after d: short for a connection
// that must fail.
func connectWithin(ns *testkit.NetNS, addr string, d time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	c, err := ns.DialContext(ctx, "tcp4", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(d))
	b, err := io.ReadAll(c)
	if err != nil || string(b) != "mgmt\n" {
		return 0, fmt.Errorf("greeting %q: %v", b, err)
	}
	return time.Since(start), nil
}

// udpFlows sends one datagram from each of count new sockets (a new flow
// each) to dst, paced every gap, from inside ns.
func udpFlows(ns *testkit.NetNS, dst string, count int, gap time.Duration) error {
	return ns.Do(func() error {
		for range count {
			c, err := net.Dial("udp4", dst)
			if err != nil {
				return err
			}
			_, _ = c.Write([]byte("x"))
			c.Close()
			time.Sleep(gap)
		}
		return nil
	})
}

// synFlood tries count TCP connections to dst from inside ns, 16 at a
// time, each given up after 100 ms.
func synFlood(ns *testkit.NetNS, dst string, count int) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for range count {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			if c, err := ns.DialContext(ctx, "tcp4", dst); err == nil {
				c.Close()
			}
		}()
	}
	wg.Wait()
}

// packetBurst sends count datagrams on one socket to dst as fast as it
// can from inside ns (a single flow: only the policer stops it).
func packetBurst(ns *testkit.NetNS, dst string, count int, broadcast bool) error {
	return ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if broadcast {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_BROADCAST, 1); err != nil {
				return err
			}
		}
		ap := netip.MustParseAddrPort(dst)
		sa := &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
		for range count {
			// a full socket buffer (ENOBUFS) is part of a flood
			_ = unix.Sendto(fd, []byte("flood"), 0, sa)
		}
		return nil
	})
}

// arpStorm sends count ARP requests for target from the guest's eth0
// (well formed: its own MAC and address), raw.
func arpStorm(g *floodGuest, target netip.Addr, count int) error {
	return g.ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		l, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		f := make([]byte, 0, 42)
		f = append(f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
		f = append(f, g.mac...)
		f = binary.BigEndian.AppendUint16(f, unix.ETH_P_ARP)
		f = append(f, 0, 1, 8, 0, 6, 4, 0, 1)
		f = append(f, g.mac...)
		f = append(f, g.addr.AsSlice()...)
		f = append(f, 0, 0, 0, 0, 0, 0)
		f = append(f, target.AsSlice()...)
		sa := &unix.SockaddrLinklayer{Ifindex: l.Index, Halen: 6, Addr: [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}
		for range count {
			_ = unix.Sendto(fd, f, 0, sa)
		}
		return nil
	})
}

// TestFloodFromGuestBridge floods from zone A's guest (many flows, a SYN
// flood, a packet flood, an ARP and a broadcast storm, each bounded) and
// checks that zone A's conntrack entries stay within the per-interface
// limit, that management connections are not tracked, that zone B's DNS
// and a management port still answer, and that the drop counters move.
func TestFloodFromGuestBridge(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	cfg.Zones = map[string][]string{"zone1": {"vnetA"}, "zone2": {"vnetB"}}
	const connLimit = 64
	cfg.Flood = FloodConfig{ConnLimit: connLimit, PacketRate: 3000, PacketBurst: 300,
		PortARPRate: 20, PortARPBurst: 40, PortBroadcastRate: 50, PortBroadcastBurst: 100}
	ga := plugGuest(t, n, "tap901i0", "vnetA", "10.10.1.50", "10.10.1.1")
	gb := plugGuest(t, n, "tap902i0", "vnetB", "10.10.2.50", "10.10.2.1")
	mc := plugGuest(t, n, "mgmtc0", "eth0", "192.0.2.10", "")

	// the node's services: a management port on the uplink, each zone's
	// resolver on its bridge's address
	serveMgmt(t, n, "192.0.2.2:8006")
	for _, a := range []string{"10.10.1.1:53", "10.10.2.1:53"} {
		testkit.ServeDNS(t, n.ListenPacket(t, "udp4", a), testkit.DNSZone{A: map[string][]netip.Addr{"probe.test": {netip.MustParseAddr("192.0.2.99")}}})
	}

	// the node routes (zone A's SYNs below are forwarded)
	if err := n.Do(func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) }); err != nil {
		t.Fatal(err)
	}
	g := startGuard(t, n, cfg)
	ctx := context.Background()
	if err := g.SetPorts(ctx, []Port{{Name: ga.port, MAC: ga.mac, IPv4: []netip.Addr{ga.addr}}, {Name: gb.port, MAC: gb.mac, IPv4: []netip.Addr{gb.addr}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := askDNS(gb.ns, "10.10.2.1"); err != nil {
		t.Fatalf("zone B's DNS before the flood: %v", err)
	}
	if _, err := connectMgmt(mc.ns, "192.0.2.2:8006"); err != nil {
		t.Fatalf("management port before the flood: %v", err)
	}
	if c := conntrackLines(t, n, "dport=8006"); c != 0 {
		t.Errorf("management connection left %d conntrack entries, want 0 (not tracked)", c)
	}
	lo, err := n.DialContext(ctx, "tcp4", "127.0.0.1:8006")
	if err == nil {
		lo.Close() // the listener is on 192.0.2.2: a refusal is an answer too
	}
	if c := conntrackLines(t, n, "dport=8006"); c != 0 {
		t.Errorf("lo connection to a management port left %d conntrack entries, want 0", c)
	}

	// zone A floods while zone B and the management side are probed
	stop := make(chan struct{})
	probes := make(chan error, 1)
	go func() {
		var worst time.Duration
		var errs []string
		for i := 0; ; i++ {
			select {
			case <-stop:
				if len(errs) > 0 {
					probes <- fmt.Errorf("%d probes failed: %s", len(errs), strings.Join(errs, "; "))
				} else {
					t.Logf("worst probe during the flood: %v", worst)
					probes <- nil
				}
				return
			case <-time.After(50 * time.Millisecond):
			}
			d1, err1 := askDNS(gb.ns, "10.10.2.1")
			d2, err2 := connectWithin(mc.ns, "192.0.2.2:8006", 10*time.Second)
			for _, e := range []error{err1, err2} {
				if e != nil {
					errs = append(errs, e.Error())
				}
			}
			worst = max(worst, d1, d2)
		}
	}()
	// many flows, paced under the packet rate: only the connection
	// limit stops them
	if err := udpFlows(ga.ns, "10.10.1.1:53", 4*connLimit, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	udpTracked := conntrackLines(t, n, "src=10.10.1.50")
	// SYNs forwarded towards the uplink, never answered (the uplink's
	// router does not exist: they end at the node's neighbour lookup,
	// after conntrack confirmed them): each a new half-open connection
	synFlood(ga.ns, "203.0.113.7:80", 2*connLimit)
	tracked := conntrackLines(t, n, "src=10.10.1.50")
	if err := packetBurst(ga.ns, "10.10.1.1:53", 20000, false); err != nil {
		t.Fatal(err)
	}
	if err := packetBurst(ga.ns, "10.10.1.255:9", 2000, true); err != nil {
		t.Fatal(err)
	}
	if err := arpStorm(ga, netip.MustParseAddr("10.10.1.1"), 2000); err != nil {
		t.Fatal(err)
	}
	close(stop)
	if err := <-probes; err != nil {
		t.Errorf("zone B's DNS or the management port during the flood: %v", err)
	}

	t.Logf("zone A's tracked connections: %d after the udp flows, %d after the SYN flood (limit %d)", udpTracked, tracked, connLimit)
	if udpTracked > connLimit+2 || tracked > connLimit+2 {
		t.Errorf("zone A holds %d/%d tracked connections, want at most the limit %d", udpTracked, tracked, connLimit)
	}
	if c := conntrackLines(t, n, "dport=8006"); c != 0 {
		t.Errorf("management connections left %d conntrack entries, want 0", c)
	}
	cs := counters(t, n)
	t.Logf("counters: %v", cs)
	for _, r := range []string{"guest-flood-conns", "guest-flood-rate", "arp-flood", "broadcast-flood", "mgmt-notrack-in", "mgmt-notrack-out"} {
		if cs[r] == 0 {
			t.Errorf("counter of rule %s did not move", r)
		}
	}
	// the same counters as the metric operators alert on
	_, mfs := gatherGuard(t, g)
	exported := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "pve_inspect_guard_rule_drop_packets_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var chain, rule string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "chain":
					chain = l.GetValue()
				case "rule":
					rule = l.GetValue()
				}
			}
			exported[chain+"/"+rule] = m.GetCounter().GetValue()
		}
	}
	for _, r := range []string{"prerouting/guest-flood-rate", "flood/guest-flood-conns", "port_guard/arp-flood", "port_guard/broadcast-flood"} {
		if exported[r] == 0 {
			t.Errorf("pve_inspect_guard_rule_drop_packets_total{%s} = %v, want > 0", r, exported[r])
		}
	}
	if err := g.Verify(ctx); err != nil {
		t.Errorf("verify after the flood: %v", err)
	}
	// zone B was never limited: its own flows pass
	if err := udpFlows(gb.ns, "10.10.2.1:53", 16, 0); err != nil {
		t.Fatal(err)
	}
	if c := conntrackLines(t, n, "src=10.10.2.50"); c < 16 {
		t.Errorf("zone B holds %d tracked flows, want its 16 (the limit is per interface)", c)
	}
}
