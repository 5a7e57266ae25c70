package egress

import (
	"net/netip"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestFlushFrom: in a namespace of its own, with conntrack on, a UDP flow
// from each of two local prefixes; FlushFrom of one prefix deletes that
// flow's entry and keeps the other's.
func TestFlushFrom(t *testing.T) {
	ns := testkit.NewNetNS(t, "ctf")
	ns.TrackUDP(t, []string{"10.77.0.1/24", "10.88.0.1/24"},
		[][2]string{{"10.77.0.1:40001", "10.88.0.1:9"}, {"10.88.0.1:40002", "10.77.0.1:9"}})
	a, b := netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr("10.88.0.1")
	if s := ns.ConntrackSources(t); !s[a] || !s[b] {
		t.Fatalf("conntrack entries before: %v, want both flows", s)
	}
	n, err := FlushFrom(ns.Handle(), []netip.Prefix{netip.MustParsePrefix("10.77.0.0/24")})
	if err != nil || n != 1 {
		t.Fatalf("FlushFrom: %d, %v; want 1 deleted", n, err)
	}
	if s := ns.ConntrackSources(t); s[a] || !s[b] {
		t.Fatalf("conntrack entries after: %v, want only 10.88.0.1's", s)
	}
	if n, err := FlushFrom(ns.Handle(), nil); n != 0 || err != nil {
		t.Fatalf("no prefixes: %d %v", n, err)
	}
}
