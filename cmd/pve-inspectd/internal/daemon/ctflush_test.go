package daemon

import (
	"net/netip"
	"testing"

	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestFlushOldTakesTheBridgesPrefixes: a new instance's flush removes the
// conntrack entries from its own bridges' prefixes only (the other
// bridge's flow stays).
func TestFlushOldTakesTheBridgesPrefixes(t *testing.T) {
	ns := testkit.NewNetNS(t, "ctd")
	ns.TrackUDP(t, []string{"10.77.0.1/24", "10.88.0.1/24"},
		[][2]string{{"10.77.0.1:40001", "10.88.0.1:9"}, {"10.88.0.1:40002", "10.77.0.1:9"}})
	e := &Egress{NS: ns.Handle(), Prefixes: func() ([]egress.IfPrefix, error) {
		return []egress.IfPrefix{{Iface: "vnetold", Prefix: netip.MustParsePrefix("10.77.0.1/24")},
			{Iface: "vnetother", Prefix: netip.MustParsePrefix("10.88.0.1/24")}}, nil
	}}
	e.flushOld("sbnew", []string{"vnetold"})
	left := ns.ConntrackSources(t)
	if left[netip.MustParseAddr("10.77.0.1")] || !left[netip.MustParseAddr("10.88.0.1")] {
		t.Fatalf("entries left by source: %v; want only the other bridge's", left)
	}
}
