package containment

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

func TestInNetworks(t *testing.T) {
	nws := []apitype.Network{{Name: "net0", CIDR: "10.200.1.0/24"}, {Name: "net1", CIDR: "10.200.7.0/24"}}
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
	if inNetworks(netip.MustParseAddr("10.200.1.17"), []apitype.Network{{CIDR: "auto"}}) {
		t.Error("an unparsed CIDR matched")
	}
}

func TestOutsideSandboxes(t *testing.T) {
	tg := sandbox.CheckTarget{
		Sandbox: apitype.Sandbox{Networks: []apitype.Network{{CIDR: "10.0.0.0/24"}}},
		Others:  []apitype.Sandbox{{Networks: []apitype.Network{{CIDR: "172.16.0.0/24"}}}},
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

func TestSplitGateways(t *testing.T) {
	others := []apitype.Sandbox{
		{Networks: []apitype.Network{{CIDR: "10.200.2.0/24", Gateway: "10.200.2.1"}}},
		{Networks: []apitype.Network{{CIDR: "10.200.3.0/24", Gateway: "10.200.3.1"}, {CIDR: "fd00:3::/64"}}},
	}
	for _, c := range []struct {
		name          string
		hosts         []string
		own, gateways []string
	}{
		{"none", nil, nil, nil},
		{"management only", []string{"192.0.2.2", "2001:db8::2"}, []string{"192.0.2.2", "2001:db8::2"}, nil},
		{"the VM's own gateway stays", []string{"10.200.1.1", "10.200.2.1"}, []string{"10.200.1.1"}, []string{"10.200.2.1"}},
		{"v4 and v6 of another zone", []string{"192.0.2.2", "10.200.3.1", "fd00:3::1"}, []string{"192.0.2.2"}, []string{"10.200.3.1", "fd00:3::1"}},
	} {
		var hosts []netip.Addr
		for _, h := range c.hosts {
			hosts = append(hosts, netip.MustParseAddr(h))
		}
		own, gws := splitGateways(hosts, others)
		if fmt.Sprint(own) != fmt.Sprint(parseAll(c.own)) || fmt.Sprint(gws) != fmt.Sprint(parseAll(c.gateways)) {
			t.Errorf("%s: own %v, gateways %v; want %v, %v", c.name, own, gws, c.own, c.gateways)
		}
	}
}

func parseAll(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// TestNextRotation: the first run starts from the clock, each next run
// takes the next rotation, also when runs race.
func TestNextRotation(t *testing.T) {
	var c SandboxChecker
	first := c.nextRotation()
	if now := uint64(time.Now().Unix()); first+5 < now || first > now {
		t.Fatalf("first rotation %d, want about the clock %d", first, now)
	}
	var wg sync.WaitGroup
	got := make([]uint64, 50)
	for i := range got {
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = c.nextRotation() }()
	}
	wg.Wait()
	slices.Sort(got)
	for i, r := range got {
		if r != first+1+uint64(i) {
			t.Fatalf("rotations %v after %d: want each next one once", got, first)
		}
	}
}

func TestWithKeepAlive(t *testing.T) {
	reapply := func(context.Context) error { return nil }
	r := &Runner{ProbePath: "/p"}
	egress := &EgressSpec{AllowedName: "a.test", DeniedName: "b.test"}
	for _, tc := range []struct {
		name    string
		egress  *EgressSpec
		reapply func(context.Context) error
		want    bool
	}{
		{"allowlist, re-apply", egress, reapply, true},
		{"allowlist, no re-apply", egress, nil, false},
		{"no egress rows", nil, reapply, false},
	} {
		spec, run := withKeepAlive(Spec{Egress: tc.egress}, r, tc.reapply)
		got := spec.Egress != nil && spec.Egress.KeepAlive
		if got != tc.want || (run.Change != nil) != tc.want || run.ProbePath != "/p" {
			t.Errorf("%s: keep-alive %v, change %v, want %v", tc.name, got, run.Change != nil, tc.want)
		}
	}
	if egress.KeepAlive || r.Change != nil {
		t.Error("withKeepAlive changed the node's spec or runner")
	}
}
