package e2e_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// TestConcurrentDeletesOutlastTheTeardownBound: as
// TestApplyOutlastsTheTeardownBound, but two deletes at once, which is
// what a cluster of many zones sees all day. The delete that runs the
// apply waits for it up to ApplyTimeout; the one that joins the next
// batch (applySDN's wait for b.done or sdnRun) still gives up at its own
// TeardownTimeout, so it fails and its sandbox is left in error with its
// zone's deletion committed but never applied by it. Fails today.
func TestConcurrentDeletesOutlastTheTeardownBound(t *testing.T) {
	e := newEmuEnvWith(t, emuSetup{
		reloadCost: pveemu.ReloadCost{PerNode: 1500 * time.Millisecond},
		opts:       []func(*options){func(o *options) { o.TeardownTimeout = 300 * time.Millisecond }},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var ids []string
	for range 2 {
		sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		ids = append(ids, sb.ID)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = e.c.Delete(ctx, id) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("delete %s whose apply outlasts the teardown bound: %v", ids[i], err)
		}
	}
}

// TestCreateOutlastsItsApply: an apply longer than CreateTimeout (and
// shorter than ApplyTimeout, 30 min by default against the create's 10)
// still fails the create: the apply's runner waits for it on a context of
// its own, but the create goes on with its expired context (clone, start,
// agent wait) and fails, then tears the sandbox down, making one more
// apply. FIDELITY (issue 36 item 10) says a slow apply no longer fails
// the create. Fails today.
func TestCreateOutlastsItsApply(t *testing.T) {
	e := newEmuEnvWith(t, emuSetup{
		reloadCost: pveemu.ReloadCost{PerNode: 1500 * time.Millisecond},
		opts:       []func(*options){func(o *options) { o.CreateTimeout = time.Second }},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatalf("create whose apply outlasts CreateTimeout but not ApplyTimeout: %v", err)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
