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

func TestOutsideSandboxes(t *testing.T) {
	tg := sandboxapi.CheckTarget{
		Sandbox: sandboxapi.Sandbox{Networks: []sandboxapi.Network{{CIDR: "10.0.0.0/24"}}},
		Others:  []sandboxapi.Sandbox{{Networks: []sandboxapi.Network{{CIDR: "172.16.0.0/24"}}}},
	}
	var lan []netip.AddrPort
	for _, a := range []string{"10.0.0.1:22", "172.16.0.1:80", "192.168.1.1:22", "100.64.0.1:80", "[2001:db8::1]:22"} {
		lan = append(lan, netip.MustParseAddrPort(a))
	}
	got := outsideSandboxes(lan, tg)
	want := []netip.AddrPort{lan[2], lan[3], lan[4]}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("got %v, want %v", got, want)
		}
	}
	if &lan[0] == &got[0] {
		t.Error("the node's list was filtered in place")
	}
}
