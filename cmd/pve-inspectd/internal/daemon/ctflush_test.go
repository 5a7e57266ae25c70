package daemon

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/firewall/egress/egresstest"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestFlushOldTakesTheBridgesPrefixes: a new instance's flush removes the
// conntrack entries from its own bridges' prefixes only (the other
// bridge's flow stays).
func TestFlushOldTakesTheBridgesPrefixes(t *testing.T) {
	ns := testkit.NewNetNS(t, "ctd")
	ns.TrackUDP(t, []string{"10.77.0.1/24", "10.88.0.1/24"},
		[][2]string{{"10.77.0.1:40001", "10.88.0.1:9"}, {"10.88.0.1:40002", "10.77.0.1:9"}})
	e := &Egress{NS: ns.Handle(), Prefixes: twoBridges}
	if err := e.flushOld("sbnew", []string{"vnetold"}); err != nil {
		t.Fatal(err)
	}
	left := ns.ConntrackSources(t)
	if left[netip.MustParseAddr("10.77.0.1")] || !left[netip.MustParseAddr("10.88.0.1")] {
		t.Fatalf("entries left by source: %v; want only the other bridge's", left)
	}
}

// twoBridges is the node's addresses: vnetold's and vnetother's.
func twoBridges() ([]egress.IfPrefix, error) {
	return []egress.IfPrefix{{Iface: "vnetold", Prefix: netip.MustParsePrefix("10.77.0.1/24")},
		{Iface: "vnetother", Prefix: netip.MustParsePrefix("10.88.0.1/24")}}, nil
}

// TestOnlyANewInstanceFlushes: the conntrack entries on a sandbox's
// bridges go at its first instance (Start: a create or a pool member's
// build) and at a claim, never at a policy change: not even of a sandbox
// the registry holds no policy of (one created before egress policies
// were on, or whose state was lost), whose guests run. Before, Set
// flushed whenever the registry did not know the zone, cutting the live
// connections of such a sandbox at its first PUT .../egress or check.
func TestOnlyANewInstanceFlushes(t *testing.T) {
	open := apitype.EgressPolicy{Mode: "open"}
	for _, c := range []struct {
		name    string
		call    func(context.Context, *Egress) error
		flushed bool
	}{
		{"policy change of a zone the registry does not know", func(ctx context.Context, e *Egress) error {
			return e.Set(ctx, "sbold", "sbold", []string{"vnetold"}, open)
		}, false},
		{"first instance", func(ctx context.Context, e *Egress) error {
			return e.Start(ctx, "sbold", "sbold", []string{"vnetold"}, open)
		}, true},
		{"claim", func(ctx context.Context, e *Egress) error {
			return e.Claim(ctx, "sbold", "sbold", []string{"vnetold"}, open)
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ns := testkit.NewNetNS(t, "cto")
			ns.TrackUDP(t, []string{"10.77.0.1/24", "10.88.0.1/24"}, [][2]string{{"10.77.0.1:40001", "10.88.0.1:9"}})
			e := &Egress{Registry: egress.NewRegistry(egresstest.NopGuard{}, egress.Rules{Mode: firewall.EgressOpen}, nil),
				NS: ns.Handle(), Prefixes: twoBridges}
			if err := c.call(context.Background(), e); err != nil {
				t.Fatal(err)
			}
			if gone := !ns.ConntrackSources(t)[netip.MustParseAddr("10.77.0.1")]; gone != c.flushed {
				t.Errorf("the sandbox's flow removed: %v, want %v", gone, c.flushed)
			}
		})
	}
}

// TestFlushFailureFailsTheNewInstance: when the entries of an earlier
// instance cannot be removed, the new instance does not start (the error
// reaches the engine, which tears the sandbox down; a Start leaves no
// policy behind). Before, the failure was logged and the create went on,
// the old tenant's peer still able to reach the new guest.
func TestFlushFailureFailsTheNewInstance(t *testing.T) {
	broken := errors.New("netlink: no buffer space")
	open := apitype.EgressPolicy{Mode: "open"}
	for _, c := range []struct {
		name string
		call func(context.Context, *Egress) error
		// undone: the policy is removed again (a claim's member is
		// torn down by the engine, its policy with it)
		undone bool
	}{
		{"first instance", func(ctx context.Context, e *Egress) error {
			return e.Start(ctx, "sbnew", "sbnew", []string{"vnetold"}, open)
		}, true},
		{"claim", func(ctx context.Context, e *Egress) error {
			return e.Claim(ctx, "sbnew", "sbnew", []string{"vnetold"}, open)
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			reg := egress.NewRegistry(egresstest.NopGuard{}, egress.Rules{Mode: firewall.EgressOpen}, nil)
			e := &Egress{Registry: reg, Prefixes: func() ([]egress.IfPrefix, error) { return nil, broken }}
			if err := c.call(context.Background(), e); !errors.Is(err, broken) {
				t.Fatalf("err %v, want the flush's", err)
			}
			if _, ok := reg.Get("sbnew"); ok == c.undone {
				t.Errorf("policy in the registry: %v, want %v", ok, !c.undone)
			}
		})
	}
}

// TestFlushOldOneAtATime: a flush holds a copy of the whole conntrack
// table, so no two run at once (a pool refill starts its members
// together).
func TestFlushOldOneAtATime(t *testing.T) {
	e := &Egress{}
	free := true
	e.Prefixes = func() ([]egress.IfPrefix, error) {
		if e.flushMu.TryLock() {
			free = true
			e.flushMu.Unlock()
		} else {
			free = false
		}
		return nil, nil
	}
	if err := e.flushOld("sbnew", []string{"vnetold"}); err != nil {
		t.Fatal(err)
	}
	if free {
		t.Error("flushOld read the node's addresses without holding flushMu")
	}
}
