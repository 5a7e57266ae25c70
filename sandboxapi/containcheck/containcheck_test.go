package containcheck

import (
	"net/netip"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi"
)

func TestInNetworks(t *testing.T) {
	nws := []sandboxapi.Network{{Name: "net0", CIDR: "10.200.1.0/24"}, {Name: "net1", CIDR: "10.200.7.0/24"}}
	for _, c := range []struct {
		addr string
		want bool
	}{
		{"10.200.1.17", true},
		{"10.200.7.2", true},
		{"10.200.2.17", false},     // another sandbox's range
		{"192.0.2.2", false},       // the node's management address
		{"169.254.169.254", false}, // metadata
	} {
		if got := inNetworks(netip.MustParseAddr(c.addr), nws); got != c.want {
			t.Errorf("inNetworks(%s) = %v, want %v", c.addr, got, c.want)
		}
	}
	if inNetworks(netip.MustParseAddr("10.200.1.17"), []sandboxapi.Network{{CIDR: "auto"}}) {
		t.Error("an unparsed CIDR matched")
	}
}
