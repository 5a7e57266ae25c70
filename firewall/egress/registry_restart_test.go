package egress

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// TestLearnedCountSurvivesRestart: an allow-list zone's learned elements
// stay in the kernel across a daemon restart (Reconcile keeps them: the
// guests cached those answers), and the restarted registry counts them
// against their owner again. Were it to count nothing, the owner would
// learn a whole new max_learned on top: the kernel would hold twice the
// owner's cap for up to the TTL ceiling (an hour), and owners*max_learned
// = the kernel set's size would no longer bound the set (others' learns
// would fail on a full set).
func TestLearnedCountSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	g := newFakeGuard()
	path := filepath.Join(t.TempDir(), "egress.json")
	allow := Rules{Mode: firewall.EgressAllowlist}
	start := func() *Registry {
		t.Helper()
		st, err := LoadState(path)
		if err != nil {
			t.Fatal(err)
		}
		reg := NewRegistry(g, Rules{Mode: firewall.EgressOpen}, st, WithMaxLearned(4))
		if err := reg.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		return reg
	}
	learn := func(reg *Registry, first byte) error {
		_, _, gen, err := reg.ForGen("vneta")
		if err != nil {
			t.Fatal(err)
		}
		var addrs []netip.Addr
		for i := range byte(4) {
			addrs = append(addrs, netip.AddrFrom4([4]byte{203, 0, 113, first + i}))
		}
		_, err = reg.Learn(ctx, "vneta", gen, addrs, firewall.Opening{Checked: true}, time.Hour)
		return err
	}
	reg := start()
	if err := reg.Set(ctx, "za", "sb-a", []string{"vneta"}, allow); err != nil {
		t.Fatal(err)
	}
	if err := learn(reg, 1); err != nil {
		t.Fatalf("first four: %v", err)
	}
	// the daemon restarts: the state file brings the zone's policy back,
	// the kernel keeps the zone's learned addresses
	reg = start()
	if _, ok := reg.Get("za"); !ok {
		t.Fatal("the restarted registry lost the zone's policy")
	}
	g.mu.Lock()
	kept := len(g.learned["vneta"])
	g.mu.Unlock()
	if kept != 4 {
		t.Fatalf("kernel keeps %d of the zone's elements across the restart, want 4", kept)
	}
	if n := reg.Learned("sb-a"); n != kept {
		t.Errorf("after restart the registry counts %d of sb-a's elements; the kernel holds %d", n, kept)
	}
	err := learn(reg, 101)
	g.mu.Lock()
	total := len(g.learned["vneta"])
	g.mu.Unlock()
	var qe *QuotaError
	if !errors.As(err, &qe) {
		t.Errorf("owner with cap 4 got 4 more elements after a restart (err %v): the kernel holds %d of its elements", err, total)
	}
}
