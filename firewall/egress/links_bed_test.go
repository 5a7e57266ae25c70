package egress

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestByAddrOnBed: the interface of a connection's local address (the
// proxy's and the resolver's TCP connections) is found through the
// address's local route, also for one of many bridges and for the
// loopback; when that route is gone (an address in a VRF's table, or an
// operator removed it), by the dump of every address, which finds the
// same interface; an address no interface holds is an error on both
// paths, never the interface of a route that merely covers it.
func TestByAddrOnBed(t *testing.T) {
	n := testkit.NewNetNS(t, "byaddr")
	for i, cidr := range []string{"10.61.0.1/24", "10.62.0.1/24", "10.63.0.1/16"} {
		n.Bridge(t, "vnetb"+string(rune('0'+i)), cidr)
	}
	n.IP(t, "link", "set", "lo", "up")
	l, err := NewNetlinkLinks(n.Handle())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cases := []struct {
		addr, iface string
		local       bool // found through its local route
	}{
		{"10.61.0.1", "vnetb0", true},
		{"10.62.0.1", "vnetb1", true},
		{"10.63.0.1", "vnetb2", true},
		{"127.0.0.1", "lo", true},
		{"10.61.0.7", "", false}, // on vnetb0's subnet, held by nobody
		{"192.0.2.1", "", false},
	}
	check := func(when string) {
		t.Helper()
		for _, c := range cases {
			a := netip.MustParseAddr(c.addr)
			got, err := l.ByAddr(a)
			switch {
			case c.iface == "" && (err == nil || !strings.Contains(err.Error(), "no interface holds")):
				t.Errorf("%s: ByAddr(%s) = %q, %v; want no interface", when, a, got, err)
			case c.iface != "" && (err != nil || got != c.iface):
				t.Errorf("%s: ByAddr(%s) = %q, %v; want %s", when, a, got, err, c.iface)
			}
			if listed, err := l.byAddrListed(a); listed != got {
				t.Errorf("%s: byAddrListed(%s) = %q, %v; ByAddr said %q", when, a, listed, err, got)
			}
		}
	}
	// the fast path is the one taken: each found address has its own
	// local route
	for _, c := range cases {
		a := netip.MustParseAddr(c.addr)
		routes, err := l.h.RouteGetWithOptions(a.AsSlice(), &netlink.RouteGetOptions{FIBMatch: true})
		local := err == nil && len(routes) == 1 && localRouteOf(routes[0], a)
		if local != c.local {
			t.Errorf("%s: local route found %v (%+v, %v), want %v", a, local, routes, err, c.local)
		}
	}
	check("with local routes")
	n.IP(t, "route", "del", "local", "10.62.0.1", "dev", "vnetb1", "table", "local")
	if routes, err := l.h.RouteGetWithOptions(netip.MustParseAddr("10.62.0.1").AsSlice(), &netlink.RouteGetOptions{FIBMatch: true}); err == nil && len(routes) == 1 && localRouteOf(routes[0], netip.MustParseAddr("10.62.0.1")) {
		t.Fatalf("10.62.0.1's local route is still there: %+v", routes)
	}
	check("without 10.62.0.1's local route")
	// what a look-up finds in its place is not taken for it: a host route
	// through another interface (as a VRF's address leaked into the main
	// table looks), a local route of a prefix (AnyIP)
	n.IP(t, "route", "add", "10.62.0.1/32", "dev", "vnetb0")
	check("with a host route of 10.62.0.1 through vnetb0")
	n.IP(t, "route", "del", "10.62.0.1/32", "dev", "vnetb0")
	n.IP(t, "route", "add", "local", "10.62.0.0/24", "dev", "vnetb0", "table", "local")
	check("with a local route of 10.62.0.0/24 through vnetb0")
}
