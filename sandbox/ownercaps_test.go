package sandbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestOwnerCapsCountClaims: a warm pool claim counts against its owner's
// caps like a cold create (refused guard-refused naming the owner cap,
// the member left in the pool), other owners and the owner "" (one owner
// for every sandbox without one) each have their own, and the pool's
// unclaimed members count against no owner.
func TestOwnerCapsCountClaims(t *testing.T) {
	ctx := context.Background()
	b := newPoolBed(t, []sandbox.PoolShape{small(3)}, func(o *sandbox.Options) {
		o.Caps = sandbox.Caps{NodeVMs: 8, OwnerSandboxes: 1, OwnerVCPUs: 2}
	})
	b.e.MaintainPool(ctx)
	want := func(owner, cold string, wantCap string) {
		t.Helper()
		req := oneVMSized("debian", 1, 512) // the shape: a claim
		if cold != "" {
			req = oneVMSized(cold, 1, 512)
		}
		req.Owner = owner
		_, err := b.e.Create(ctx, req)
		var ce *sandbox.CapError
		switch {
		case wantCap == "" && err != nil:
			t.Fatalf("%s's create (cold %q): %v", owner, cold, err)
		case wantCap != "" && (!errors.As(err, &ce) || ce.Cap != wantCap):
			t.Fatalf("%s's create (cold %q): %v, want cap %s", owner, cold, err, wantCap)
		}
	}
	want("alice", "", "")                      // a claim
	want("alice", "", "owner_sandboxes")       // a second claim
	want("alice", "alpine", "owner_sandboxes") // a second cold create
	want("bob", "alpine", "")                  // bob's own
	want("", "", "")                           // the owner ""
	want("-", "alpine", "owner_sandboxes")     // "-" is that owner too
	if n := b.ready("small"); n != 1 {
		t.Errorf("%d members ready, want 1 (two claimed, the refused claim left its member)", n)
	}
}

// TestCapsWithOwnerDefaults: an unset owner cap is a quarter of its node
// cap, rounded up, and stays unset under an unlimited node cap; a set one
// stays.
func TestCapsWithOwnerDefaults(t *testing.T) {
	for _, tt := range []struct{ in, want sandbox.Caps }{
		{sandbox.Caps{}, sandbox.Caps{}},
		{sandbox.Caps{NodeSandboxes: 4, NodeVMs: 10, NodeVCPUs: 1, NodeMemoryMiB: 65536},
			sandbox.Caps{NodeSandboxes: 4, NodeVMs: 10, NodeVCPUs: 1, NodeMemoryMiB: 65536, OwnerSandboxes: 1, OwnerVMs: 3, OwnerVCPUs: 1, OwnerMemoryMiB: 16384}},
		{sandbox.Caps{NodeSandboxes: 8, OwnerSandboxes: 8, OwnerVMs: 2}, sandbox.Caps{NodeSandboxes: 8, OwnerSandboxes: 8, OwnerVMs: 2}},
	} {
		if got := tt.in.WithOwnerDefaults(); got != tt.want {
			t.Errorf("%+v: %+v, want %+v", tt.in, got, tt.want)
		}
	}
}
