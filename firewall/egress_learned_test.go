package firewall

import (
	"net/netip"
	"testing"
)

// TestLearnedElementKey: the keys LearnOpen writes decode back to their
// interface, address and port; keys of another shape are not elements.
func TestLearnedElementKey(t *testing.T) {
	addr := netip.MustParseAddr("203.0.113.7")
	checked := append(ifname("vneta"), addr.AsSlice()...)
	port := append(append([]byte{}, checked...), be16(8080)[0], be16(8080)[1], 0, 0)
	for _, tc := range []struct {
		name  string
		key   []byte
		ports bool
		want  LearnedElement
		ok    bool
	}{
		{"name-checked address", checked, false, LearnedElement{Iface: "vneta", Addr: addr}, true},
		{"address and port", port, true, LearnedElement{Iface: "vneta", Addr: addr, Port: 8080}, true},
		{"port key in the address set", port, false, LearnedElement{}, false},
		{"address key in the ports set", checked, true, LearnedElement{}, false},
		{"port 0", append(append([]byte{}, checked...), 0, 0, 0, 0), true, LearnedElement{}, false},
		{"no interface", append(ifname(""), addr.AsSlice()...), false, LearnedElement{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := learnedElement(tc.key, tc.ports)
			if ok != tc.ok || got != tc.want {
				t.Errorf("learnedElement = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
