package firewall

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// serveGreeting answers every connection to addr in ns with "mgmt\n" (what
// connectMgmt expects).
func serveGreeting(t *testing.T, ns *testkit.NetNS, addr string) {
	ln := ns.Listen(t, "tcp4", addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("mgmt\n"))
			c.Close()
		}
	}()
}

// TestGuestCannotFillNodeNeighbourTable (issue 34, review 2): a guest
// routes through its gateway (the node) to hundreds of addresses of its
// own zone's subnet (a sandbox may ask for a /16). Without the guard's
// routed-to-no-guest rule the node made a neighbour entry for each, in the
// one IPv4 neighbour table of the whole host (gc_thresh3 1024): a few
// hundred more and no entry can be made, the management gateway's is
// evicted, and the node's API stops answering anyone off-link. With it
// the node resolves only guests' addresses. What must keep working does:
// a guest reaches a guest of its bridge at layer 2 (through br_netfilter's
// forward hook, as on a node with the Proxmox firewall on), also one of
// another node behind a VXLAN uplink whose address this node's port map
// lacks, a guest of another vnet of its zone through the node, and the
// uplink.
func TestGuestCannotFillNodeNeighbourTable(t *testing.T) {
	n := basicNode(t)
	n.Bridge(t, "vnetA2", "10.10.3.1/24")
	cfg := testConfig(t)                                   // zone1: vnetA, vnetA2
	n.IP(t, "addr", "add", "10.77.0.1/16", "dev", "vnetA") // the sandbox's /16 network
	for _, sysctl := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/bridge/bridge-nf-call-iptables"} {
		if err := n.Do(func() error { return os.WriteFile(sysctl, []byte("1"), 0o644) }); err != nil {
			t.Fatalf("%s: %v", filepath.Base(sysctl), err)
		}
	}
	a := plugGuest(t, n, "tap901i0", "vnetA", "10.10.1.50", "10.10.1.1")
	c := plugGuest(t, n, "tap902i0", "vnetA", "10.10.1.60", "10.10.1.1")
	b := plugGuest(t, n, "tap903i0", "vnetA2", "10.10.3.50", "10.10.3.1")
	// a guest of another node, behind a VXLAN zone's uplink port: no
	// guest port here, no address in this node's port map
	r := plugGuest(t, n, "vxlan77", "vnetA", "10.10.1.70", "10.10.1.1")
	a.ns.IP(t, "route", "add", "10.77.0.0/16", "via", "10.10.1.1")
	g := startGuard(t, n, cfg)
	ports := []Port{
		{Name: a.port, MAC: a.mac, IPv4: []netip.Addr{a.addr}},
		{Name: c.port, MAC: c.mac, IPv4: []netip.Addr{c.addr}},
		{Name: b.port, MAC: b.mac, IPv4: []netip.Addr{b.addr}},
	}
	if err := g.SetPorts(t.Context(), ports); err != nil {
		t.Fatal(err)
	}
	if err := g.Verify(t.Context()); err != nil {
		t.Fatalf("verify with the port map: %v", err)
	}

	serveGreeting(t, c.ns, "10.10.1.60:7000")
	serveGreeting(t, b.ns, "10.10.3.50:7000")
	serveGreeting(t, r.ns, "10.10.1.70:7000")
	// the internet: a host behind the node's default gateway
	up := plugGuest(t, n, "up0", "eth0", "192.0.2.1", "")
	up.ns.IP(t, "addr", "add", "203.0.113.7/32", "dev", "lo")
	up.ns.IP(t, "route", "add", "10.10.0.0/16", "via", "192.0.2.2")
	serveGreeting(t, up.ns, "203.0.113.7:7001")
	for _, dst := range []string{"10.10.1.60:7000", "10.10.1.70:7000", "10.10.3.50:7000", "203.0.113.7:7001"} {
		if _, err := connectMgmt(a.ns, dst); err != nil {
			t.Errorf("guest A to %s: %v", dst, err)
		}
	}

	const targets = 300
	before := counters(t, n)
	if err := a.ns.Do(func() error {
		return sendUDPTo(targets, func(i int) string { return fmt.Sprintf("10.77.%d.%d:9", 1+i/250, 1+i%250) })
	}); err != nil {
		t.Fatal(err)
	}
	// the node's stack routes them in a softirq, later on a loaded
	// machine: wait until the rule counted them all, then look at what
	// the node resolved
	waitDropped(t, n, before, targets, "routed-to-no-guest")
	// (multicast entries, the node's own IGMP reports, are not counted)
	strangers := strangerNeighbours(t, n, "vnetA", a.addr, c.addr, r.addr)
	if len(strangers) > 0 {
		t.Errorf("after %d routed packets to no guest the node resolves %d addresses on vnetA that no guest holds, e.g. %v", targets, len(strangers), strangers[:min(5, len(strangers))])
	}
	// A guest's address that leaves the port map is no longer reachable
	// through the node (the set follows the map); one that stays is.
	if err := g.SetPorts(t.Context(), ports[:2]); err != nil {
		t.Fatal(err)
	}
	if _, err := connectWithin(a.ns, "10.10.3.50:7000", 2*time.Second); err == nil {
		t.Error("guest A still reaches a port-map-less address through the node")
	}
	if _, err := connectMgmt(a.ns, "10.10.1.60:7000"); err != nil {
		t.Errorf("guest A to its bridge peer after the change: %v", err)
	}
	if err := g.Verify(t.Context()); err != nil {
		t.Fatalf("verify after the change: %v", err)
	}
}

// sendUDPTo sends one datagram to each of count addresses (addr(i)).
func sendUDPTo(count int, addr func(i int) string) error {
	for i := range count {
		c, err := net.Dial("udp4", addr(i))
		if err != nil {
			return err
		}
		_, _ = c.Write([]byte("x"))
		c.Close()
		time.Sleep(time.Millisecond)
	}
	return nil
}
