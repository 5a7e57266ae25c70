package firewall

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestGuestCannotSweepOnLinkRouteOfUplinkAnyScope (review 5): an on-link
// route is one without a gateway, whatever its scope. refreshMgmtLocked
// takes only scope-link routes into @uplink_nets4, but the kernel resolves
// the destination itself for every route whose next hop has no gateway
// (fib_select_path / rt_nexthop: nh_gw 0 -> daddr), and
// "ip route add NET dev X scope global", "ip route add NET via 0.0.0.0 dev X"
// and a route over a nexthop object ("ip nexthop add id N dev X";
// "ip route add NET nhid N": iproute2 gives such a route scope global, as
// zebra does for FRR's routes) are all scope universe.
func TestGuestCannotSweepOnLinkRouteOfUplinkAnyScope(t *testing.T) {
	for name, route := range map[string][]string{
		"scope-global": {"route", "add", "198.51.0.0/16", "dev", "eth0", "scope", "global"},
		"via-zero":     {"route", "add", "198.51.0.0/16", "via", "0.0.0.0", "dev", "eth0"},
		"nhid":         {"route", "add", "198.51.0.0/16", "nhid", "77"},
	} {
		t.Run(name, func(t *testing.T) {
			n := basicNode(t)
			cfg := testConfig(t)
			if name == "nhid" {
				n.IP(t, "nexthop", "add", "id", "77", "dev", "eth0")
			}
			n.IP(t, route...)
			if err := n.Do(func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) }); err != nil {
				t.Fatal(err)
			}
			a := plugGuest(t, n, "tap901i0", "vnetA", "10.10.1.50", "10.10.1.1")
			g := startGuard(t, n, cfg)
			if err := g.SetPorts(t.Context(), []Port{{Name: a.port, MAC: a.mac, IPv4: []netip.Addr{a.addr}}}); err != nil {
				t.Fatal(err)
			}
			const targets = 300
			before := counters(t, n)
			if err := a.ns.Do(func() error {
				return sendUDPTo(targets, func(i int) string { return fmt.Sprintf("198.51.%d.%d:9", 1+i/250, 1+i%250) })
			}); err != nil {
				t.Fatal(err)
			}
			// every packet was routed to the uplink and dropped there,
			// before the node resolved its destination
			waitDropped(t, n, before, targets, "uplink-subnet")
			if s := strangerNeighbours(t, n, "eth0"); len(s) > 20 {
				out, _ := n.nft(t, "list", "set", "inet", TableName, SetUplinkNets4)
				t.Errorf("after %d routed packets the node resolves %d addresses on its uplink, e.g. %v\n%s", targets, len(s), s[:5],
					strings.TrimSpace(out))
			}
		})
	}
}

// TestGuestCannotResolveOtherGuestsOnItsVnetThroughZoneDHCP (review 5):
// guest-dhcp-ciaddr admits any ciaddr in @guest_addrs4, the addresses of
// every guest of the node, not the sender's own. dnsmasq sends an
// unrelayed reply with IP_PKTINFO naming the interface it came in on
// (dnsmasq dhcp.c dhcp_packet, from memory), and the kernel, finding no
// route to ciaddr through that interface, assumes it on-link there
// (net/ipv4/route.c ip_route_output_key_hash_rcu: "Apparently, routing
// tables are wrong. Assume, that the destination is on link."). So a
// guest on vnetA that broadcasts INFORMs from 0.0.0.0, each with the
// address of another guest of the node (here 300 addresses of vnetB),
// makes the node resolve each of them on vnetA: entries no traffic of
// those guests ever makes, one per vnet with an attacker per guest
// address (K attacking vnets x N guest addresses, not N).
func TestGuestCannotResolveOtherGuestsOnItsVnetThroughZoneDHCP(t *testing.T) {
	const targets = 300
	var others []netip.Addr
	n, a := zoneDHCPNodeWith(t, func(n *testNS) []Port {
		b := plugGuest(t, n, "tap902i0", "vnetB", "10.10.2.50", "10.10.2.1")
		for i := range targets {
			others = append(others, netip.Addr{})
			others[i] = netip.AddrFrom4([4]byte{10, 88, byte(i / 250), byte(1 + i%250)})
		}
		return []Port{{Name: b.port, MAC: b.mac, IPv4: append([]netip.Addr{b.addr}, others...)}}
	})
	before := counters(t, n)
	if err := a.ns.Do(func() error {
		raw, err := openRaw("eth0")
		if err != nil {
			return err
		}
		defer raw.close()
		for i, x := range others {
			p := dhcpRelayed(a.mac, netip.IPv4Unspecified(), uint32(i+1))
			k := x.As4()
			copy(p[12:16], k[:])
			p[242] = 8 // INFORM
			if err := raw.send(dhcpFrame(a.mac, p)); err != nil {
				return err
			}
			time.Sleep(2 * time.Millisecond)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// every INFORM reached the node and was dropped before dnsmasq could
	// answer it (the port's pins first: bridge dhcp-ciaddr)
	waitDropped(t, n, before, targets, "dhcp-ciaddr", "guest-dhcp-ciaddr")
	if s := strangerNeighbours(t, n, "vnetA", a.addr); len(s) > 20 {
		t.Errorf("after %d INFORMs naming other guests' addresses, the node resolves %d of them on the sender's vnetA, e.g. %v", targets, len(s), s[:5])
	}
}

// zoneDHCPNodeWith is zoneDHCPNode with more mapped ports, made by more
// before the guard starts.
func zoneDHCPNodeWith(t *testing.T, more func(*testNS) []Port) (*testNS, *floodGuest) {
	n := basicNode(t)
	cfg := testConfig(t)
	n.IP(t, "addr", "add", "10.77.0.1/16", "dev", "vnetA")
	a := plugGuest(t, n, "tap901i0", "vnetA", "10.77.0.50", "10.77.0.1")
	ports := append([]Port{{Name: a.port, MAC: a.mac, IPv4: []netip.Addr{a.addr}}}, more(n)...)
	g := startGuard(t, n, cfg)
	if err := g.SetPorts(t.Context(), ports); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	hosts := filepath.Join(dir, "ethers")
	if err := os.WriteFile(hosts, []byte(fmt.Sprintf("%s,%s\n", a.mac, a.addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := n.Command(ctx, "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--bind-interfaces",
		"--except-interface=lo", "--port=0", "--user=root", "--pid-file="+filepath.Join(dir, "pid"),
		"--dhcp-leasefile="+filepath.Join(dir, "leases"), "--dhcp-hostsfile="+hosts, "--dhcp-ignore=tag:!known",
		"--dhcp-authoritative", "--log-facility=-", "--interface=vnetA",
		"--dhcp-range=set:vnetA,10.77.0.10,10.77.255.250,255.255.0.0,1h")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	waitDHCPServer(t, n)
	return n, a
}
