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

// TestOtherGuestsFromTheNode: the other zones' guest addresses come from
// the node (GuestAddrs, keyed by VM id and zone), only inside that
// sandbox's own subnets; a sandbox the node knows no address of, or no
// VM of, is left out. No guest is asked (CheckTarget carries none of the
// other sandboxes' guests).
func TestOtherGuestsFromTheNode(t *testing.T) {
	node := map[string][]netip.Addr{
		"101@za": {netip.MustParseAddr("192.0.2.9"), netip.MustParseAddr("10.200.1.17")}, // the first lies outside za's subnet
		"102@zb": {netip.MustParseAddr("10.200.1.18")},                                   // in za's subnet, not zb's
		"104@zd": {netip.MustParseAddr("10.200.4.20")},
	}
	var asked []string
	c := &SandboxChecker{GuestAddrs: func(vmid int, zone string) ([]netip.Addr, error) {
		k := fmt.Sprintf("%d@%s", vmid, zone)
		asked = append(asked, k)
		if a, ok := node[k]; ok {
			return a, nil
		}
		return nil, fmt.Errorf("no VM %d", vmid)
	}}
	sb := func(zone, cidr string, vmids ...int) apitype.Sandbox {
		s := apitype.Sandbox{Zone: zone, Networks: []apitype.Network{{CIDR: cidr}}}
		for _, id := range vmids {
			s.VMs = append(s.VMs, apitype.VM{VMID: id})
		}
		return s
	}
	tg := sandbox.CheckTarget{Others: []apitype.Sandbox{
		sb("za", "10.200.1.0/24", 101, 105),
		sb("zb", "10.200.2.0/24", 102),
		sb("zc", "10.200.3.0/24", 103), // the node has no address for it
		sb("ze", "10.200.5.0/24"),      // no VM
		sb("zd", "10.200.4.0/24", 104),
	}}
	got := fmt.Sprint(c.otherGuests(tg, 22))
	if want := "[10.200.1.17:22 10.200.4.20:22]"; got != want {
		t.Errorf("other zone guests %s, want %s", got, want)
	}
	if want := "[101@za 102@zb 103@zc 104@zd]"; fmt.Sprint(asked) != want {
		t.Errorf("asked the node for %v, want %s (each sandbox's first VM, in its own zone)", asked, want)
	}
	if got := (&SandboxChecker{}).otherGuests(tg, 22); got != nil {
		t.Errorf("without GuestAddrs: %v, want no rows", got)
	}
}
