package egress

import (
	"net"
	"net/netip"
	"testing"

	"github.com/ti-mo/conntrack"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestFlushFrom: in a namespace of its own, with conntrack on (a ct
// rule), a UDP flow from each of two local prefixes; FlushFrom of one
// prefix deletes that flow's entry and keeps the other's.
func TestFlushFrom(t *testing.T) {
	ns := testkit.NewNetNS(t, "ctf")
	ns.IP(t, "addr", "add", "10.77.0.1/24", "dev", "lo")
	ns.IP(t, "addr", "add", "10.88.0.1/24", "dev", "lo")
	ns.NFT(t, "table inet ctf {\n chain out {\n  type filter hook output priority 0;\n  ct state new counter accept\n }\n}\n")
	send := func(from, to string) {
		t.Helper()
		if err := ns.Do(func() error {
			c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(from)), net.UDPAddrFromAddrPort(netip.MustParseAddrPort(to)))
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
	send("10.77.0.1:40001", "10.88.0.1:9")
	send("10.88.0.1:40002", "10.77.0.1:9")
	sources := func() map[netip.Addr]bool {
		t.Helper()
		out := map[netip.Addr]bool{}
		if err := ns.Do(func() error {
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
			t.Fatal(err)
		}
		return out
	}
	a, b := netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr("10.88.0.1")
	if s := sources(); !s[a] || !s[b] {
		t.Fatalf("conntrack entries before: %v, want both flows", s)
	}
	n, err := FlushFrom(ns.Handle(), []netip.Prefix{netip.MustParsePrefix("10.77.0.0/24")})
	if err != nil || n != 1 {
		t.Fatalf("FlushFrom: %d, %v; want 1 deleted", n, err)
	}
	if s := sources(); s[a] || !s[b] {
		t.Fatalf("conntrack entries after: %v, want only 10.88.0.1's", s)
	}
	if n, err := FlushFrom(ns.Handle(), nil); n != 0 || err != nil {
		t.Fatalf("no prefixes: %d %v", n, err)
	}
}
