package egress

import (
	"context"
	"net/netip"
	"slices"
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
	k := NewKernelDrops(f, reg, den, nil, 0, nil)
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

// changingOwners is the registry, with a change of iface run right
// after an attribution of it (between KernelDrops' ForInstance and its
// write).
type changingOwners struct {
	*Registry
	iface  string
	change func()
}

func (c *changingOwners) ForInstance(iface string) (string, uint64, uint64, error) {
	owner, gen, began, err := c.Registry.ForInstance(iface)
	if iface == c.iface && c.change != nil {
		c.change()
	}
	return owner, gen, began, err
}

// TestKernelDropsRecords: each destination member that grew in a read
// (after the baseline) is one refused flow record in its owner's ring,
// with the address alone, the packets and bytes dropped since the last
// read and no VM; a member read across a change of its interface's
// instance (a claim, the zone given to another owner or removed, before
// the read or between the attribution and the write) is recorded
// nowhere, one read across a policy change of the same instance is
// recorded, and one owner's drops never reach another's ring.
func TestKernelDropsRecords(t *testing.T) {
	a, b := netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("198.51.100.9")
	drop := func(iface string, to netip.Addr, packets, bytes uint64) firewall.EgressDrop {
		return firewall.EgressDrop{Iface: iface, Addr: to, Packets: packets, Bytes: bytes}
	}
	type rec struct {
		dest           string
		packets, bytes int64
	}
	none := map[string][]rec{"sb-a": nil, "sb-b": nil}
	claim := func(ctx context.Context, t *testing.T, reg *Registry) {
		if err := reg.Begin(ctx, "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressNone}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		reads [][]firewall.EgressDrop
		// before runs before read beforeRead (0: the last); during runs
		// between vneta's attribution and the write, in the last read
		before     func(ctx context.Context, t *testing.T, reg *Registry)
		beforeRead int
		during     func(ctx context.Context, t *testing.T, reg *Registry)
		want       map[string][]rec
	}{
		{name: "baseline not recorded",
			reads: [][]firewall.EgressDrop{{drop("vneta", a, 5, 300), drop("vnetb", b, 2, 120)}},
			want:  none},
		{name: "growth recorded, each to its owner",
			reads: [][]firewall.EgressDrop{{drop("vneta", a, 5, 300)},
				{drop("vneta", a, 8, 480), drop("vneta", b, 1, 60), drop("vnetb", b, 4, 240)}},
			want: map[string][]rec{"sb-a": {{"203.0.113.7", 3, 180}, {"198.51.100.9", 1, 60}}, "sb-b": {{"198.51.100.9", 4, 240}}}},
		{name: "unchanged member not recorded",
			reads: [][]firewall.EgressDrop{{drop("vneta", a, 5, 300)}, {drop("vneta", a, 5, 300)}},
			want:  none},
		{name: "member expired and came back counts whole",
			reads: [][]firewall.EgressDrop{{drop("vneta", a, 7, 420)}, {drop("vneta", a, 2, 120)}},
			want:  map[string][]rec{"sb-a": {{"203.0.113.7", 2, 120}}, "sb-b": nil}},
		{name: "policy change of the same instance before the read recorded",
			reads: [][]firewall.EgressDrop{{drop("vneta", a, 5, 300), drop("vnetb", b, 1, 60)},
				{drop("vneta", a, 9, 540), drop("vnetb", b, 2, 120)}},
			before: func(ctx context.Context, t *testing.T, reg *Registry) {
				if err := reg.Set(ctx, "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressAllowlist}); err != nil {
					t.Fatal(err)
				}
			},
			want: map[string][]rec{"sb-a": {{"203.0.113.7", 4, 240}}, "sb-b": {{"198.51.100.9", 1, 60}}}},
		// vneta had no member at the last read: its drops since, across
		// its sandbox's policy change, are its
		{name: "member new across a policy change of the same instance recorded",
			reads: [][]firewall.EgressDrop{{drop("vnetb", b, 1, 60)}, {drop("vneta", a, 4, 240), drop("vnetb", b, 2, 120)}},
			before: func(ctx context.Context, t *testing.T, reg *Registry) {
				if err := reg.Set(ctx, "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressAllowlist}); err != nil {
					t.Fatal(err)
				}
			},
			want: map[string][]rec{"sb-a": {{"203.0.113.7", 4, 240}}, "sb-b": {{"198.51.100.9", 1, 60}}}},
		{name: "claim before the read not recorded",
			reads: [][]firewall.EgressDrop{{drop("vneta", a, 5, 300), drop("vnetb", b, 1, 60)},
				{drop("vneta", a, 9, 540), drop("vnetb", b, 2, 120)}},
			before: claim,
			want:   map[string][]rec{"sb-a": nil, "sb-b": {{"198.51.100.9", 1, 60}}}},
		{name: "zone given to another owner before the read not recorded",
			reads: [][]firewall.EgressDrop{{drop("vneta", a, 5, 300)}, {drop("vneta", a, 9, 540)}},
			before: func(ctx context.Context, t *testing.T, reg *Registry) {
				if err := reg.Set(ctx, "za", "sb-c", []string{"vneta"}, Rules{Mode: firewall.EgressNone}); err != nil {
					t.Fatal(err)
				}
			},
			want: map[string][]rec{"sb-a": nil, "sb-b": nil, "sb-c": nil}},
		// vneta had no member at the last read; its pool member is
		// claimed, and its old guest's drops of before the claim show
		// up at the next read
		{name: "member new since a generation change not recorded",
			reads:  [][]firewall.EgressDrop{{drop("vnetb", b, 1, 60)}, {drop("vneta", a, 4, 240), drop("vnetb", b, 2, 120)}},
			before: claim,
			want:   map[string][]rec{"sb-a": nil, "sb-b": {{"198.51.100.9", 1, 60}}}},
		{name: "growth after the first read under a new generation recorded",
			reads:  [][]firewall.EgressDrop{{drop("vnetb", b, 1, 60)}, {drop("vneta", a, 4, 240)}, {drop("vneta", a, 6, 360)}},
			before: claim, beforeRead: 1,
			want: map[string][]rec{"sb-a": {{"203.0.113.7", 2, 120}}, "sb-b": nil}},
		{name: "zone removed before the read not recorded",
			reads: [][]firewall.EgressDrop{{drop("vneta", a, 5, 300)}, {drop("vneta", a, 9, 540)}},
			before: func(ctx context.Context, t *testing.T, reg *Registry) {
				if err := reg.Remove(ctx, "za"); err != nil {
					t.Fatal(err)
				}
			},
			want: map[string][]rec{"sb-a": nil, "sb-b": nil, DefaultOwnerOf("", "vneta"): nil}},
		{name: "claim during the read not recorded",
			reads:  [][]firewall.EgressDrop{{drop("vneta", a, 5, 300)}, {drop("vneta", a, 9, 540), drop("vnetb", b, 1, 60)}},
			during: claim,
			want:   map[string][]rec{"sb-a": nil, "sb-b": {{"198.51.100.9", 1, 60}}}},
		{name: "policy change of the same instance during the read recorded",
			reads: [][]firewall.EgressDrop{{drop("vneta", a, 5, 300)}, {drop("vneta", a, 9, 540), drop("vnetb", b, 1, 60)}},
			during: func(ctx context.Context, t *testing.T, reg *Registry) {
				if err := reg.Set(ctx, "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressAllowlist}); err != nil {
					t.Error(err)
				}
			},
			want: map[string][]rec{"sb-a": {{"203.0.113.7", 4, 240}}, "sb-b": {{"198.51.100.9", 1, 60}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			reg := NewRegistry(newFakeGuard(), Rules{Mode: firewall.EgressOpen}, nil)
			for _, z := range []struct{ zone, owner, iface string }{{"za", "sb-a", "vneta"}, {"zb", "sb-b", "vnetb"}} {
				if err := reg.Set(ctx, z.zone, z.owner, []string{z.iface}, Rules{Mode: firewall.EgressNone}); err != nil {
					t.Fatal(err)
				}
			}
			elog := NewLog(LogConfig{PerOwner: 16})
			reg.OnDrop(func(_, owner string) { elog.Forget(owner) })
			own := &changingOwners{Registry: reg, iface: "vneta"}
			f := &fakeDrops{}
			k := NewKernelDrops(f, own, NewDenials(), elog, 0, nil)
			for i, r := range tc.reads {
				last := i == len(tc.reads)-1
				if at := tc.beforeRead; tc.before != nil && (at > 0 && i == at || at == 0 && last) {
					tc.before(ctx, t, reg)
				}
				if last && tc.during != nil {
					own.change = func() {
						own.change = nil
						tc.during(ctx, t, reg)
					}
				}
				f.dests = r
				if err := k.Poll(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for owner, want := range tc.want {
				var got []rec
				for _, r := range elog.Read(owner, LogQuery{}).Records {
					got = append(got, rec{r.Dest.Addr().String(), r.PacketsOut, r.BytesOut})
					if r.Type != RecordFlow || r.Verdict != VerdictRefused || r.Reason != ReasonAddress || r.Dest.Port() != 0 ||
						r.Proto != "" || r.Guest != (Guest{}) || r.Time.IsZero() || r.BytesIn != 0 || r.PacketsIn != 0 {
						t.Errorf("%s: record %+v", owner, r)
					}
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s's records %v, want %v", owner, got, want)
				}
			}
		})
	}
}
