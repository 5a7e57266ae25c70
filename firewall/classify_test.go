package firewall

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

func TestClassifyDefaultRoutes(t *testing.T) {
	cases := []struct {
		name  string
		route func(n *testNS, eth0, eth1 netlink.Link) *netlink.Route
		want  []string
	}{
		{"no default route", nil, nil},
		{"ipv4 default", func(n *testNS, eth0, _ netlink.Link) *netlink.Route {
			return &netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP("192.0.2.1"),
				Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}
		}, []string{"eth0"}},
		{"ipv6 default", func(n *testNS, _, eth1 netlink.Link) *netlink.Route {
			return &netlink.Route{LinkIndex: eth1.Attrs().Index, Gw: net.ParseIP("2001:db8:2::1"),
				Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}
		}, []string{"eth1"}},
		{"ipv4 multipath", func(n *testNS, eth0, eth1 netlink.Link) *netlink.Route {
			return &netlink.Route{Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)},
				MultiPath: []*netlink.NexthopInfo{
					{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP("192.0.2.1")},
					{LinkIndex: eth1.Attrs().Index, Gw: net.ParseIP("198.51.100.1")},
				}}
		}, []string{"eth0", "eth1"}},
		{"blackhole default is no uplink", func(n *testNS, _, _ netlink.Link) *netlink.Route {
			return &netlink.Route{Type: 6 /* RTN_BLACKHOLE */, Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNS(t)
			eth0 := n.Bridge(t, "eth0", "192.0.2.2/24")
			eth1 := n.Bridge(t, "eth1", "198.51.100.2/24")
			a6, _ := netlink.ParseAddr("2001:db8:2::2/64")
			if err := n.Netlink().AddrAdd(eth1, &netlink.Addr{IPNet: a6.IPNet, Flags: 0x80 /* IFA_F_NODAD */}); err != nil {
				t.Fatal(err)
			}
			n.Bridge(t, "vnet1", "10.10.1.1/24")
			if tc.route != nil {
				if err := n.Netlink().RouteAdd(tc.route(n, eth0, eth1)); err != nil {
					t.Fatalf("add route: %v", err)
				}
			}
			cls, err := Classify(context.Background(), Config{Trusted: []string{"vnet1"}}, WithNetNS(n.Handle()))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cls.Management, tc.want) {
				t.Errorf("management = %v, want %v", cls.Management, tc.want)
			}
			if !slices.Equal(cls.Trusted, []string{"vnet1"}) {
				t.Errorf("trusted = %v", cls.Trusted)
			}
			if !slices.Contains(cls.Interfaces, "vnet1") || !slices.Contains(cls.Interfaces, "lo") {
				t.Errorf("interfaces = %v", cls.Interfaces)
			}
			if slices.Contains(tc.want, "eth0") && !slices.ContainsFunc(cls.UplinkNets, func(p netip.Prefix) bool { return p.String() == "192.0.2.0/24" }) {
				t.Errorf("uplink nets = %v, want 192.0.2.0/24", cls.UplinkNets)
			}
		})
	}
}

// TestWatchResubscribes: a subscription that fails or closes is set up
// again, and every (re)subscription resyncs.
func TestWatchResubscribes(t *testing.T) {
	var routeCalls atomic.Int32
	c := &classifier{
		subscribeRoutes: func(ch chan<- netlink.RouteUpdate, done <-chan struct{}, o netlink.RouteSubscribeOptions) error {
			switch routeCalls.Add(1) {
			case 1:
				return errors.New("injected: subscribe failed")
			case 2:
				close(ch) // injected: subscription closed
				return nil
			case 3:
				go o.ErrorCallback(errors.New("injected: receive error"))
				return nil
			}
			return nil // healthy from now on
		},
		subscribeLinks: func(chan<- netlink.LinkUpdate, <-chan struct{}, netlink.LinkSubscribeOptions) error { return nil },
	}
	ctx, cancel := context.WithCancel(context.Background())
	var resyncs, errs atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.watch(ctx, func() { resyncs.Add(1) }, func(error) { errs.Add(1) })
	}()
	deadline := time.Now().Add(time.Minute)
	for routeCalls.Load() < 4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if routeCalls.Load() < 4 {
		t.Fatalf("subscribed %d times, want 4 (3 failures then healthy)", routeCalls.Load())
	}
	if errs.Load() != 3 {
		t.Errorf("errors reported %d, want 3", errs.Load())
	}
	if resyncs.Load() < 3 {
		t.Errorf("resyncs %d, want one per successful subscription (>= 3)", resyncs.Load())
	}
}
