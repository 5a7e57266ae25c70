package testkit

import (
	"net"
	"net/netip"
	"testing"

	"github.com/ti-mo/conntrack"
)

// TrackUDP turns conntrack on in the namespace (a ct rule on output),
// gives loopback the addresses of from's prefixes and sends one UDP
// datagram for each [from, to] pair of address:ports, so that each pair
// has a conntrack entry.
func (n *NetNS) TrackUDP(tb testing.TB, prefixes []string, pairs [][2]string) {
	tb.Helper()
	for _, p := range prefixes {
		n.IP(tb, "addr", "add", p, "dev", "lo")
	}
	n.NFT(tb, "table inet testkitct {\n chain out {\n  type filter hook output priority 0;\n  ct state new counter accept\n }\n}\n")
	for _, p := range pairs {
		if err := n.Do(func() error {
			c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(p[0])), net.UDPAddrFromAddrPort(netip.MustParseAddrPort(p[1])))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("x"))
			return err
		}); err != nil {
			tb.Fatal(err)
		}
	}
}

// ConntrackSources returns the original source addresses of the
// namespace's conntrack entries.
func (n *NetNS) ConntrackSources(tb testing.TB) map[netip.Addr]bool {
	tb.Helper()
	out := map[netip.Addr]bool{}
	if err := n.Do(func() error {
		c, err := conntrack.Dial(nil)
		if err != nil {
			return err
		}
		defer c.Close()
		fs, err := c.Dump(nil)
		for _, f := range fs {
			out[f.TupleOrig.IP.SourceAddress] = true
		}
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	return out
}
