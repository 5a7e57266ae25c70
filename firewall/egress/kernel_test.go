package egress

import (
	"context"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// fakeDrops hands out the sets' members as a test sets them.
type fakeDrops struct{ ifs, dests []firewall.EgressDrop }

func (f *fakeDrops) EgressDrops(context.Context) ([]firewall.EgressDrop, []firewall.EgressDrop, error) {
	return f.ifs, f.dests, nil
}

func TestKernelDropsAttributesGrowth(t *testing.T) {
	ctx := context.Background()
	reg := NewRegistry(newFakeGuard(), Rules{Mode: firewall.EgressOpen}, nil)
	if err := reg.Set(ctx, "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressNone}); err != nil {
		t.Fatal(err)
	}
	den := NewDenials()
	a, b := netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("198.51.100.9")
	f := &fakeDrops{ifs: []firewall.EgressDrop{{Iface: "vneta", Packets: 5}},
		dests: []firewall.EgressDrop{{Iface: "vneta", Addr: a, Packets: 5}}}
	k := NewKernelDrops(f, reg, den, 0, nil)
	count := func(owner string) float64 { return testutil.ToFloat64(den.total.WithLabelValues(owner, ReasonAddress)) }
	if err := k.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if c := count("sb-a"); c != 0 || len(den.Recent("sb-a")) != 0 {
		t.Fatalf("baseline counted: %v, %+v", c, den.Recent("sb-a"))
	}
	// vneta grows by 3 (2 to a, 1 to the new b); vnetx (the node
	// default) by 4 from a new member; mgmt0 is no guest's
	f.ifs = []firewall.EgressDrop{{Iface: "vneta", Packets: 8}, {Iface: "vnetx", Packets: 4}, {Iface: "mgmt0", Packets: 9}}
	f.dests = []firewall.EgressDrop{{Iface: "vneta", Addr: a, Packets: 7}, {Iface: "vneta", Addr: b, Packets: 1},
		{Iface: "vnetx", Addr: b, Packets: 4}}
	if err := k.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if c := count("sb-a"); c != 3 {
		t.Errorf("sb-a counted %v, want 3", c)
	}
	if c := count(DefaultOwnerOf("", "vnetx")); c != 4 {
		t.Errorf("node default counted %v, want 4", c)
	}
	got := map[string]bool{}
	for _, d := range den.Recent("sb-a") {
		got[d.Reason+" "+d.Dest] = true
	}
	if len(got) != 2 || !got["address 203.0.113.7"] || !got["address 198.51.100.9"] {
		t.Errorf("sb-a recent denials %+v", den.Recent("sb-a"))
	}
	// nothing grew: nothing new; a member that expired and came back
	// smaller counts whole
	before := len(den.Recent("sb-a"))
	f.ifs = []firewall.EgressDrop{{Iface: "vneta", Packets: 2}}
	f.dests = []firewall.EgressDrop{{Iface: "vneta", Addr: a, Packets: 7}}
	if err := k.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if c := count("sb-a"); c != 5 {
		t.Errorf("sb-a counted %v after a member came back with 2, want 5", c)
	}
	if n := len(den.Recent("sb-a")); n != before {
		t.Errorf("an unchanged destination was noted again: %d recent, want %d", n, before)
	}
}
