package hostnet_test

import (
	"context"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/pve-inspect/pve-inspect/hostnet"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// TestPrefixes builds a host in a namespace: a LAN address, a route to
// another network through the LAN gateway, a default route and a route in
// a policy table; every network but the default is listed.
func TestPrefixes(t *testing.T) {
	h := lanHost(t)
	got, err := hostnet.NewAt(h).Prefixes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"192.168.1.0/24", "10.50.0.0/16", "172.20.0.0/20", "10.200.0.0/24"} {
		if !slices.Contains(got, netip.MustParsePrefix(want)) {
			t.Errorf("%s missing from %v", want, got)
		}
	}
	for _, p := range got {
		if p.Bits() == 0 {
			t.Errorf("default route listed: %v", got)
		}
	}
}

// TestHasAddress: the LAN interface carries its address and not another;
// an interface that does not exist is no error.
func TestHasAddress(t *testing.T) {
	l := hostnet.NewAt(lanHost(t))
	for _, tc := range []struct {
		link, addr string
		want       bool
	}{
		{"lan0", "192.168.1.10", true},
		{"lan0", "192.168.1.11", false},
		{"lan1", "192.168.1.10", false},
		{"vnone", "192.168.1.10", false},
	} {
		got, err := l.HasAddress(context.Background(), tc.link, netip.MustParseAddr(tc.addr))
		if err != nil || got != tc.want {
			t.Errorf("HasAddress(%s, %s) = %v, %v; want %v", tc.link, tc.addr, got, err, tc.want)
		}
	}
}

// lanHost is a namespace whose host sits on the LAN 192.168.1.0/24 with a
// default route, a route to 10.50.0.0/16, one to 10.200.0.0/24 (inside the
// sandboxes' auto pool) and one in policy table 100.
func lanHost(t *testing.T) *netlink.Handle {
	h := testkit.NewNetNS(t, "phn").Netlink()
	lan := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lan0"}, PeerName: "lan1"}
	if err := h.LinkAdd(lan); err != nil {
		t.Fatal(err)
	}
	link, err := h.LinkByName("lan0")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"lan0", "lan1"} {
		l, err := h.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	addr, _ := netlink.ParseAddr("192.168.1.10/24")
	if err := h.AddrAdd(link, addr); err != nil {
		t.Fatal(err)
	}
	gw := net.ParseIP("192.168.1.1")
	for _, r := range []netlink.Route{
		{LinkIndex: link.Attrs().Index, Dst: mustNet("10.50.0.0/16"), Gw: gw},
		{LinkIndex: link.Attrs().Index, Dst: mustNet("0.0.0.0/0"), Gw: gw},
		{LinkIndex: link.Attrs().Index, Dst: mustNet("172.20.0.0/20"), Gw: gw, Table: 100},
		{LinkIndex: link.Attrs().Index, Dst: mustNet("10.200.0.0/24"), Gw: gw},
	} {
		if err := h.RouteAdd(&r); err != nil {
			t.Fatalf("route %v: %v", r.Dst, err)
		}
	}
	return h
}

// TestCreateRefusesHostOverlap: the sandbox API, reading the host's
// networks over netlink, refuses a sandbox network on the host's LAN or on
// a routed network without touching Proxmox, and "auto" steps over a host
// route inside its pool.
func TestCreateRefusesHostOverlap(t *testing.T) {
	h := lanHost(t)
	g := apitest.NewGuests()
	px := apitest.NewProxmox(g, map[string]int{"debian": 9000})
	eng, err := sandbox.New(sandbox.Options{
		Node:     "node1",
		Proxmox:  px,
		Guests:   g.Dial,
		StateDir: t.TempDir(),
		// Two ranges, the first under the host route: whichever this
		// node's search starts at (the node's place in the pool), the
		// free one is the second.
		AutoCIDRPool: netip.MustParsePrefix("10.200.0.0/23"),
		AgentTimeout: time.Minute,
		HostNetworks: hostnet.NewAt(h).Prefixes,
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sandboxapi.New(eng, sandboxapi.Options{
		SpoolDir: t.TempDir(),
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.LocalHandler())
	t.Cleanup(ts.Close)
	c := client.New(ts.URL)
	ctx := context.Background()
	vms := []apitype.VMRequest{{Template: "debian"}}
	for _, tc := range []struct{ cidr, host string }{
		{"192.168.1.0/24", "192.168.1.0/24"},
		{"192.168.0.0/16", "192.168.1.0/24"},
		{"10.50.7.0/24", "10.50.0.0/16"},
	} {
		before := px.Mutations()
		_, err := c.Create(ctx, apitype.CreateRequest{VMs: vms, Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: tc.cidr}}})
		// a conflict that does not name the host's network (a tenant's
		// token maps none of the node's networks through it)
		if !client.IsProblem(err, apitype.ProblemConflict) || !strings.Contains(err.Error(), "a network of the node's host") ||
			(tc.host != tc.cidr && strings.Contains(err.Error(), tc.host)) {
			t.Errorf("cidr %s on a host with %s: %v, want a conflict that does not name the host's network", tc.cidr, tc.host, err)
		}
		if px.Mutations() != before {
			t.Errorf("cidr %s: refused create changed Proxmox", tc.cidr)
		}
	}
	sb, err := c.Create(ctx, apitype.CreateRequest{VMs: vms})
	if err != nil {
		t.Fatal(err)
	}
	if got := sb.Networks[0].CIDR; got != "10.200.1.0/24" {
		t.Errorf("auto picked %s, want 10.200.1.0/24 past the host route 10.200.0.0/24", got)
	}
}

func mustNet(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}
