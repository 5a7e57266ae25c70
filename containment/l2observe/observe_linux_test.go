package l2observe

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// bridgeBed is a node namespace with bridge br0 (10.10.1.1) and two guest
// namespaces on ports pa and pb.
type bridgeBed struct {
	node, a, b *testkit.NetNS
	nodeNS     netns.NsHandle
	macA       net.HardwareAddr
}

func newBridgeBed(t *testing.T) *bridgeBed {
	t.Helper()
	bb := &bridgeBed{node: testkit.NewNetNS(t, "plon"), a: testkit.NewNetNS(t, "ploa"), b: testkit.NewNetNS(t, "plob")}
	bb.node.IP(t, "link", "add", "br0", "address", bridgeMAC.String(), "type", "bridge")
	bb.node.IP(t, "addr", "add", "10.10.1.1/24", "dev", "br0")
	bb.node.IP(t, "link", "set", "br0", "up")
	for i, g := range []*testkit.NetNS{bb.a, bb.b} {
		port := []string{"pa", "pb"}[i]
		bb.node.IP(t, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", g.Name)
		bb.node.IP(t, "link", "set", port, "master", "br0", "up")
		g.IP(t, "link", "set", "eth0", "up")
		g.IP(t, "addr", "add", []string{"10.10.1.2/24", "10.10.1.3/24"}[i], "dev", "eth0")
	}
	if err := bb.a.Do(func() error {
		i, err := net.InterfaceByName("eth0")
		bb.macA = i.HardwareAddr
		return err
	}); err != nil {
		t.Fatal(err)
	}
	h, err := netns.GetFromName(bb.node.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	bb.nodeNS = h
	// the bridge forwards as soon as its ports are up (no STP)
	time.Sleep(100 * time.Millisecond)
	return bb
}

// send sends frames raw on eth0 of ns.
func send(ns *testkit.NetNS, frames ...[]byte) error {
	return ns.Do(func() error {
		i, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for _, f := range frames {
			if err := unix.Sendto(fd, f, 0, &unix.SockaddrLinklayer{Ifindex: i.Index, Halen: 6}); err != nil {
				return err
			}
		}
		return nil
	})
}

// TestObserveInNamespaces: without a guard every frame of guest A is seen
// on the bridge and at its sibling's port; with a bridge-family drop rule
// the dropped frames are seen nowhere while the legitimate one still is.
// Frames the sibling sends are seen on the bridge, never as "forwarded to
// the sibling".
func TestObserveInNamespaces(t *testing.T) {
	testkit.RequireRoot(t, "ip", "nft")
	bb := newBridgeBed(t)
	spoofMAC := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x66}
	nonceSib := []byte("nonce-s-0123456789")
	hexA, hexB, hexS := "6e6f6e63652d612d30313233343536373839", "6e6f6e63652d622d30313233343536373839", "6e6f6e63652d732d30313233343536373839"
	o := New(WithNetNS(bb.nodeNS))
	q := Query{Bridge: "br0", Exclude: []string{"pa"}, Nonces: [][]byte{nonceA, nonceB, nonceSib}, Gateway: gateway, Linger: 200 * time.Millisecond}
	cases := []struct {
		name   string
		rules  string
		nonces map[string][]string
		claims []Claim
	}{
		{"no guard", "", map[string][]string{hexA: {"br0", "pb"}, hexB: {"br0", "pb"}, hexS: {"br0"}},
			[]Claim{{"br0", bb.macA.String()}, {"pb", bb.macA.String()}}},
		{"guard", `table bridge plotest {
	chain pre {
		type filter hook prerouting priority -200; policy accept;
		iifname "pa" ether saddr != ` + bb.macA.String() + ` drop
		iifname "pa" arp saddr ip 10.10.1.1 drop
	}
}
`, map[string][]string{hexA: {"br0", "pb"}, hexS: {"br0"}}, nil},
	}
	for _, c := range cases {
		if c.rules != "" {
			bb.node.NFT(t, c.rules)
		}
		s, err := o.Observe(context.Background(), q, func(context.Context) error {
			if err := send(bb.a, udp(bb.macA, nonceA), udp(spoofMAC, nonceB), arp(bb.macA, gateway, 0)); err != nil {
				return err
			}
			return send(bb.b, udp(net.HardwareAddr{0x02, 0, 0, 0, 0, 0x77}, nonceSib))
		})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if s.Bridge != "br0" || !slices.Equal(s.Ports, []string{"pb"}) {
			t.Errorf("%s: watched %s %v, want br0 [pb] (pa excluded)", c.name, s.Bridge, s.Ports)
		}
		if !equalMaps(s.Nonces, c.nonces) || !slices.Equal(s.GatewayClaims, c.claims) {
			t.Errorf("%s: nonces %v claims %v, want %v %v", c.name, s.Nonces, s.GatewayClaims, c.nonces, c.claims)
		}
	}
}

func TestObserveFailures(t *testing.T) {
	testkit.RequireRoot(t, "ip", "nft")
	bb := newBridgeBed(t)
	o := New(WithNetNS(bb.nodeNS))
	for _, c := range []struct{ bridge, err string }{{"nosuch0", "nosuch0"}, {"pa", "not a bridge"}} {
		called := false
		_, err := o.Observe(context.Background(), Query{Bridge: c.bridge, Nonces: [][]byte{nonceA}}, func(context.Context) error {
			called = true
			return nil
		})
		if err == nil || !strings.Contains(err.Error(), c.err) || called {
			t.Errorf("bridge %s: %v (work called %v), want an error mentioning %q and no work", c.bridge, err, called, c.err)
		}
	}
	// the work's error comes back with the sightings
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := o.Observe(ctx, Query{Bridge: "br0", Nonces: [][]byte{nonceA}}, func(ctx context.Context) error { return ctx.Err() }); err == nil {
		t.Error("cancelled watch: no error")
	}
}
