package firewall

import (
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// review7Setup is a node whose new interfaces start with rp_filter 0 (all
// and default: the kernel's, and what pve-docs asks of an EVPN exit node;
// pve-firewall's sysctl file sets all to 2, default stays 0).
func review7Setup(t *testing.T, n *testNS) {
	t.Helper()
	if err := n.Do(func() error {
		for _, c := range []string{"all", "default"} {
			if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+c+"/rp_filter", []byte("0"), 0o644); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func portRPFilter(t *testing.T, n *testNS, port string) string {
	t.Helper()
	var v []byte
	_ = n.Do(func() (err error) { v, err = os.ReadFile("/proc/sys/net/ipv4/conf/" + port + "/rp_filter"); return err })
	return strings.TrimSpace(string(v))
}

// linkLocalARPFlood sends, from guest a, 300 ARP frames frame(sip), one
// for each forged sender address sip (10.10.101.1 on), waits until the
// node dropped them all, and returns the neighbour entries it made for
// addresses no guest has. The frames go to a link-local group the bridge
// hands to the node's stack on the port device (review 6): the arp
// table's guest-port rules drop each one there, before arp_process, and
// count it as they do.
func linkLocalARPFlood(t *testing.T, n *testNS, a *floodGuest, frame func(sip netip.Addr) []byte) []string {
	t.Helper()
	const flood = 300
	before := counters(t, n)
	if err := a.ns.Do(func() error {
		raw, err := openRaw("eth0")
		if err != nil {
			return err
		}
		defer raw.close()
		for i := range flood {
			sip := netip.AddrFrom4([4]byte{10, 10, byte(101 + i/250), byte(1 + i%250)})
			if err := raw.send(frame(sip)); err != nil {
				return err
			}
			time.Sleep(time.Millisecond)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var rules []string
	for _, p := range GuestPortPrefixes {
		rules = append(rules, "guest-port-arp-"+p)
	}
	waitDropped(t, n, before, flood, rules...)
	var s []string
	for _, dev := range []string{a.port, "vnetA"} {
		s = append(s, strangerNeighbours(t, n, dev, a.addr)...)
	}
	return s
}

// TestRecreatedGuestPortKeepsSourceCheck (review 7): the source check is
// set only for a port reclassify sees as new ("joined": absent from the
// previous classification, keyed by name). A port deleted and created
// again under the same name on the same bridge between two reclassify
// snapshots (here: while another call holds g.mu, after the reclassify
// goroutine took its snapshot; also events coalesced by settle, or missed
// and relisted after ENOBUFS) leaves the classification equal
// (cls.Equal(g.state): nothing done, no "joined"), and the new device
// carries default.rp_filter, 0. An LXC container rebooting
// (veth100i0 deleted and created again), a NIC hot-unplugged and plugged,
// or a VM restarted while the daemon is busy get there. The link-local
// ARP flood of review 6 then fills the table again.
func TestRecreatedGuestPortKeepsSourceCheck(t *testing.T) {
	n := basicNode(t)
	review7Setup(t, n)
	cfg := testConfig(t)
	cfg.ProcRoot = "/proc"
	cfg.VerifyInterval = 500 * time.Millisecond // the periodic sweep, the backstop this case needs
	g := startGuard(t, n, cfg)
	runGuard(t, g)
	a := plugGuest(t, n, "veth901i0", "vnetA", "10.10.1.50", "10.10.1.1")
	eventually(t, "the port's rp_filter 2", func() bool { return portRPFilter(t, n, a.port) == "2" })
	if err := g.SetPorts(t.Context(), []Port{{Name: a.port, MAC: a.mac, IPv4: []netip.Addr{a.addr}}}); err != nil {
		t.Fatal(err)
	}
	// Another call holds the guard's lock (SetPorts, SetEgress, repair,
	// a slow nft dump on a loaded node) when some link changes: the
	// reclassify goroutine takes its snapshot (g.cls.current) and waits.
	g.mu.Lock()
	locked := true
	defer func() {
		if locked {
			g.mu.Unlock()
		}
	}()
	if err := n.Netlink().LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br7"}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	// Meanwhile the container reboots: its veth goes and comes back under
	// its name, on its bridge, with its MAC (Proxmox: lxc.net.0.hwaddr).
	br, err := n.Netlink().LinkByName("vnetA")
	if err != nil {
		t.Fatal(err)
	}
	old, err := n.Netlink().LinkByName(a.port)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Netlink().LinkDel(old); err != nil {
		t.Fatal(err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a.port, MasterIndex: br.Attrs().Index},
		PeerName: "eth0", PeerNamespace: netlink.NsFd(int(a.ns.Handle())), PeerHardwareAddr: a.mac}
	if err := n.Netlink().LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	n.IP(t, "link", "set", a.port, "up")
	a.ns.IP(t, "addr", "add", a.addr.String()+"/24", "dev", "eth0")
	a.ns.IP(t, "link", "set", "eth0", "up")
	time.Sleep(300 * time.Millisecond) // the classifier has every event
	g.mu.Unlock()
	locked = false
	// The link events left the classification as it was; the periodic
	// sweep (checkSources) gives the new device its source check. The ARP
	// table drops the flood below whatever the sysctl says.
	eventually(t, "the recreated port's rp_filter 2", func() bool { return portRPFilter(t, n, a.port) == "2" })
	gw := netip.MustParseAddr("10.10.1.1")
	dst := net.HardwareAddr{0x01, 0x80, 0xc2, 0, 0, 0x0e}
	if s := linkLocalARPFlood(t, n, a, func(sip netip.Addr) []byte { return arpRequestTo(dst, a.mac, sip, gw) }); len(s) > 20 {
		t.Errorf("after the port came back, 300 link-local ARP requests left %d neighbour entries for addresses no guest has, e.g. %v", len(s), s[:5])
	}
}

// TestLinkLocalGratuitousARPWithArpAccept (review 7): rp_filter guards
// only the request path of arp_process (ip_route_input_noref ->
// fib_validate_source). With arp_accept 1 (all or the port; FRR/EVPN and
// anycast-gateway setups turn it on to learn from gratuitous ARP), a
// gratuitous ARP (sip == tip) received on the port device creates an
// entry for sip with no source check at all (net/ipv4/arp.c arp_process:
// "if (arp_accept(in_dev, sip)) ... if (!n && (is_garp || ...)) n =
// __neigh_lookup(&arp_tbl, &sip, dev, 1)"; from memory). The guard
// leaves arp_accept alone on guest ports.
func TestLinkLocalGratuitousARPWithArpAccept(t *testing.T) {
	n := basicNode(t)
	review7Setup(t, n)
	if err := n.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/conf/all/arp_accept", []byte("1"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.ProcRoot = "/proc"
	a := plugGuest(t, n, "tap902i0", "vnetA", "10.10.1.50", "10.10.1.1")
	g := startGuard(t, n, cfg)
	if v := portRPFilter(t, n, a.port); v != "2" {
		t.Fatalf("rp_filter %s", v)
	}
	if err := g.SetPorts(t.Context(), []Port{{Name: a.port, MAC: a.mac, IPv4: []netip.Addr{a.addr}}}); err != nil {
		t.Fatal(err)
	}
	dst := net.HardwareAddr{0x01, 0x80, 0xc2, 0, 0, 0x0e}
	gratuitous := func(sip netip.Addr) []byte { return arpRequestTo(dst, a.mac, sip, sip) }
	if s := linkLocalARPFlood(t, n, a, gratuitous); len(s) > 20 {
		t.Errorf("with arp_accept 1, 300 gratuitous ARPs to 01:80:c2:00:00:0e left %d neighbour entries for addresses no guest has, e.g. %v", len(s), s[:5])
	}
}
