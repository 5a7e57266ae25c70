package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestReapNotSerialisedBehindStuckTeardown: the reaper deletes expired
// sandboxes several at a time, each within its own TeardownTimeout, so
// three of mallory's sandboxes whose deletes hang (an operation that
// never ends) cost one timeout, not three, and bob's expired sandbox is
// deleted in the same pass. Before, the reaper deleted them one after
// another: k stuck sandboxes held every other owner's for k timeouts.
func TestReapNotSerialisedBehindStuckTeardown(t *testing.T) {
	const teardown = time.Second
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	e := newEngine(t, func(o *sandbox.Options) { o.Now, o.TeardownTimeout = clk.now, teardown })
	ctx := context.Background()
	var stuck []func(error) error
	for range 3 {
		req := oneVM("debian")
		req.Owner = "mallory"
		sb, err := e.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		_, _, _, end, err := e.Begin(ctx, sb.ID, "") // an operation that does not end
		if err != nil {
			t.Fatal(err)
		}
		stuck = append(stuck, end)
	}
	defer func() {
		for _, end := range stuck {
			_ = end(nil)
		}
	}()
	req := oneVM("debian")
	req.Owner = "bob"
	bob, err := e.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	clk.add(2 * time.Minute)
	start := time.Now()
	n := e.Reap(ctx)
	took := time.Since(start)
	if _, ok := e.Get(bob.ID); ok || n != 1 {
		t.Errorf("reaped %d; bob's expired sandbox still there: %v", n, ok)
	}
	if took >= 2*teardown {
		t.Errorf("the pass took %v with 3 stuck deletes of %v each: the reaper waits for them one after another", took.Round(time.Millisecond), teardown)
	}
}
