package l2observe

import (
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"testing"
)

var (
	guestMAC  = net.HardwareAddr{0xbc, 0x24, 0x11, 0, 1, 1}
	bridgeMAC = net.HardwareAddr{0x02, 0xaa, 0, 0, 0, 1}
	gateway   = netip.MustParseAddr("10.10.1.1")
	nonceA    = []byte("nonce-a-0123456789")
	nonceB    = []byte("nonce-b-0123456789")
)

// udp is a broadcast IPv4/UDP frame from mac (10.10.1.2 to the gateway)
// carrying payload; the headers are valid, as br_netfilter drops others.
func udp(mac net.HardwareAddr, payload []byte) []byte {
	ip := []byte{0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0, 10, 10, 1, 2, 10, 10, 1, 1}
	binary.BigEndian.PutUint16(ip[2:], uint16(28+len(payload)))
	var sum uint32
	for i := 0; i < len(ip); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	sum = sum>>16 + sum&0xffff
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum+sum>>16))
	u := []byte{0, 9, 0, 9, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	return slices.Concat([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, mac, []byte{0x08, 0}, ip, u, payload)
}

// arp is a broadcast ARP reply from mac claiming spa, tagged with vlan if non-zero.
func arp(mac net.HardwareAddr, spa netip.Addr, vlan uint16) []byte {
	s := spa.As4()
	hdr := slices.Concat([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, mac)
	if vlan != 0 {
		hdr = binary.BigEndian.AppendUint16(append(hdr, 0x81, 0), vlan)
	}
	return slices.Concat(hdr, []byte{0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 2}, mac, s[:], make([]byte, 6), s[:], make([]byte, 18))
}

func TestRecorder(t *testing.T) {
	type seen struct {
		iface string
		frame []byte
	}
	cases := []struct {
		name   string
		frames []seen
		nonces map[string][]string
		claims []Claim
	}{
		{"nothing", nil, map[string][]string{}, nil},
		{"nonce on bridge and port, twice", []seen{{"br0", udp(guestMAC, nonceA)}, {"pb", udp(guestMAC, nonceA)}, {"br0", udp(guestMAC, nonceA)}},
			map[string][]string{"6e6f6e63652d612d30313233343536373839": {"br0", "pb"}}, nil},
		{"two nonces", []seen{{"pb", udp(guestMAC, nonceB)}, {"pc", udp(guestMAC, nonceA)}},
			map[string][]string{"6e6f6e63652d612d30313233343536373839": {"pc"}, "6e6f6e63652d622d30313233343536373839": {"pb"}}, nil},
		{"truncated nonce", []seen{{"br0", udp(guestMAC, nonceA[:10])}}, map[string][]string{}, nil},
		{"gateway claimed", []seen{{"br0", arp(guestMAC, gateway, 0)}, {"pb", arp(guestMAC, gateway, 7)}},
			map[string][]string{}, []Claim{{"br0", guestMAC.String()}, {"pb", guestMAC.String()}}},
		{"the bridge's own claim", []seen{{"pb", arp(bridgeMAC, gateway, 0)}}, map[string][]string{}, nil},
		{"another address claimed", []seen{{"pb", arp(guestMAC, netip.MustParseAddr("10.10.1.7"), 0)}}, map[string][]string{}, nil},
		{"short frames", []seen{{"br0", []byte{1, 2, 3}}, {"br0", arp(guestMAC, gateway, 0)[:30]}}, map[string][]string{}, nil},
	}
	for _, c := range cases {
		r := newRecorder(Query{Bridge: "br0", Nonces: [][]byte{nonceA, nonceB}, Gateway: gateway}, bridgeMAC, []string{"pc", "pb"})
		for _, f := range c.frames {
			r.record(f.iface, f.frame)
		}
		s := r.sightings()
		if !equalMaps(s.Nonces, c.nonces) || !slices.Equal(s.GatewayClaims, c.claims) || !slices.Equal(s.Ports, []string{"pb", "pc"}) {
			t.Errorf("%s: got %+v, want nonces %v claims %v", c.name, s, c.nonces, c.claims)
		}
	}
}

func equalMaps(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

func TestQueryValidate(t *testing.T) {
	cases := []struct {
		name string
		q    Query
		ok   bool
	}{
		{"nonces", Query{Bridge: "vneta", Nonces: [][]byte{nonceA}}, true},
		{"gateway only", Query{Bridge: "vneta", Gateway: gateway}, true},
		{"no bridge", Query{Nonces: [][]byte{nonceA}}, false},
		{"long bridge", Query{Bridge: "abcdefghijklmnop", Nonces: [][]byte{nonceA}}, false},
		{"short nonce", Query{Bridge: "vneta", Nonces: [][]byte{[]byte("abc")}}, false},
		{"v6 gateway", Query{Bridge: "vneta", Gateway: netip.MustParseAddr("fd00::1")}, false},
		{"nothing to look for", Query{Bridge: "vneta"}, false},
	}
	for _, c := range cases {
		if err := c.q.validate(); (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok=%v", c.name, err, c.ok)
		}
	}
}
