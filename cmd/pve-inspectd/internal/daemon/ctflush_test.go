package daemon

import (
	"net"
	"net/netip"
	"testing"

	"github.com/ti-mo/conntrack"

	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestFlushOldTakesTheBridgesPrefixes: a new instance's flush removes the
// conntrack entries from its own bridges' prefixes only (the other
// bridge's flow stays).
func TestFlushOldTakesTheBridgesPrefixes(t *testing.T) {
	ns := testkit.NewNetNS(t, "ctd")
	ns.IP(t, "addr", "add", "10.77.0.1/24", "dev", "lo")
	ns.IP(t, "addr", "add", "10.88.0.1/24", "dev", "lo")
	ns.NFT(t, "table inet ctd {\n chain out {\n  type filter hook output priority 0;\n  ct state new counter accept\n }\n}\n")
	for _, p := range [][2]string{{"10.77.0.1:40001", "10.88.0.1:9"}, {"10.88.0.1:40002", "10.77.0.1:9"}} {
		if err := ns.Do(func() error {
			c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(p[0])), net.UDPAddrFromAddrPort(netip.MustParseAddrPort(p[1])))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("x"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	e := &Egress{NS: ns.Handle(), Prefixes: func() ([]egress.IfPrefix, error) {
		return []egress.IfPrefix{{Iface: "vnetold", Prefix: netip.MustParsePrefix("10.77.0.1/24")},
			{Iface: "vnetother", Prefix: netip.MustParsePrefix("10.88.0.1/24")}}, nil
	}}
	e.flushOld("sbnew", []string{"vnetold"})
	left := map[netip.Addr]bool{}
	if err := ns.Do(func() error {
		c, err := conntrack.Dial(nil)
		if err != nil {
			return err
		}
		defer c.Close()
		fs, err := c.Dump(nil)
		for _, f := range fs {
			left[f.TupleOrig.IP.SourceAddress] = true
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if left[netip.MustParseAddr("10.77.0.1")] || !left[netip.MustParseAddr("10.88.0.1")] {
		t.Fatalf("entries left by source: %v; want only the other bridge's", left)
	}
}
