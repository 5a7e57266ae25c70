package egress

import (
	"context"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// TestKernelDropsDenialsEndWithInstance: a claim (Begin) or a Remove
// between KernelDrops' attribution of an interface (ForInstance) and its
// writes leaves the owner's denials as the claim or Remove left them
// (forgotten), as it leaves the record ring: the count and the noted
// destination are written under IfInstance too (they were not: the old
// instance's drops landed in the claimer's denials, or brought a deleted
// sandbox's series back; found by a review).
func TestKernelDropsDenialsEndWithInstance(t *testing.T) {
	a := netip.MustParseAddr("203.0.113.7")
	for _, tc := range []struct {
		name   string
		change func(ctx context.Context, t *testing.T, reg *Registry)
	}{
		{"claim", func(ctx context.Context, t *testing.T, reg *Registry) {
			if err := reg.Begin(ctx, "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressNone}); err != nil {
				t.Error(err)
			}
		}},
		{"remove", func(ctx context.Context, t *testing.T, reg *Registry) {
			if err := reg.Remove(ctx, "za"); err != nil {
				t.Error(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			reg := NewRegistry(newFakeGuard(), Rules{Mode: firewall.EgressOpen}, nil)
			if err := reg.Set(ctx, "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressNone}); err != nil {
				t.Fatal(err)
			}
			den := NewDenials()
			elog := NewLog(LogConfig{PerOwner: 16})
			reg.OnDrop(func(_, owner string) { den.Forget(owner); elog.Forget(owner) })
			own := &changingOwners{Registry: reg, iface: "vneta"}
			f := &fakeDrops{ifs: []firewall.EgressDrop{{Iface: "vneta", Packets: 5}},
				dests: []firewall.EgressDrop{{Iface: "vneta", Addr: a, Packets: 5, Bytes: 300}}}
			k := NewKernelDrops(f, own, den, elog, 0, nil)
			if err := k.Poll(ctx); err != nil {
				t.Fatal(err)
			}
			// the old instance's guest drops 4 more to a; the read attributes
			// them, then the claim/Remove runs, then the writes
			f.ifs = []firewall.EgressDrop{{Iface: "vneta", Packets: 9}}
			f.dests = []firewall.EgressDrop{{Iface: "vneta", Addr: a, Packets: 9, Bytes: 540}}
			own.change = func() { own.change = nil; tc.change(ctx, t, reg) }
			if err := k.Poll(ctx); err != nil {
				t.Fatal(err)
			}
			if n := len(elog.Read("sb-a", LogQuery{}).Records); n != 0 {
				t.Errorf("record: %d old-instance records", n)
			}
			if c := testutil.ToFloat64(den.total.WithLabelValues("sb-a", ReasonAddress)); c != 0 {
				t.Errorf("denials: the old instance's %v drops counted for sb-a after its %s", c, tc.name)
			}
			if r := den.Recent("sb-a"); len(r) != 0 {
				t.Errorf("denials: the old instance's destination kept for sb-a after its %s: %+v", tc.name, r)
			}
		})
	}
}

// TestKernelDropsPolicyChangeAfterRestart: after a daemon restart the
// persisted zones' instances count as begun before the first read, so
// the first policy change of the same sandbox keeps its drops (began is
// not persisted: it was a new baseline, and the refused datagrams read
// across it were recorded nowhere; found by a review).
func TestKernelDropsPolicyChangeAfterRestart(t *testing.T) {
	ctx := context.Background()
	g := newFakeGuard()
	path := t.TempDir() + "/egress.json"
	start := func() *Registry {
		st, err := LoadState(path)
		if err != nil {
			t.Fatal(err)
		}
		return NewRegistry(g, Rules{Mode: firewall.EgressOpen}, st)
	}
	reg := start()
	if err := reg.Set(ctx, "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressNone}); err != nil {
		t.Fatal(err)
	}
	reg = start() // the daemon restarts
	a := netip.MustParseAddr("203.0.113.7")
	elog := NewLog(LogConfig{PerOwner: 16})
	f := &fakeDrops{dests: []firewall.EgressDrop{{Iface: "vneta", Addr: a, Packets: 5, Bytes: 300}}}
	k := NewKernelDrops(f, reg, NewDenials(), elog, 0, nil)
	if err := k.Poll(ctx); err != nil { // baseline
		t.Fatal(err)
	}
	f.dests = []firewall.EgressDrop{{Iface: "vneta", Addr: a, Packets: 9, Bytes: 540}}
	if err := reg.Set(ctx, "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressAllowlist}); err != nil {
		t.Fatal(err)
	}
	if err := k.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(elog.Read("sb-a", LogQuery{}).Records); n != 1 {
		t.Errorf("sb-a's drops across its own policy change after a restart: %d records, want 1", n)
	}
}
