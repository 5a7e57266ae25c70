package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestReview3ReapPassIsNoBarrier: the parallel reaper (reap.go) lists
// the sandboxes due when a pass starts and waits for every one of them
// (wg.Wait) before the next tick can start a pass. One sandbox whose
// delete hangs (an operation that does not end: a check whose client
// pipelines requests and never reads, see sandboxapi
// TestReview3StuckCheckClientHoldsDelete) holds the pass for its whole
// TeardownTimeout (5 min in the daemon), and every other owner's sandbox
// that expires meanwhile waits for the pass to end: bob's sandbox, due a
// moment after mallory's, outlives its expiry by a teardown timeout,
// not by a reaper interval, and holds its node caps meanwhile. The
// stuck sandbox goes to state error and is due again next pass.
func TestReview3ReapPassIsNoBarrier(t *testing.T) {
	const teardown = 3 * time.Second
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	e := newEngine(t, func(o *sandbox.Options) {
		o.Now, o.TeardownTimeout, o.ReaperInterval = clk.now, teardown, 50*time.Millisecond
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := oneVM("debian")
	req.Owner = "mallory"
	req.TTLSeconds = 60
	m, err := e.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	_, _, _, end, err := e.Begin(ctx, m.ID, "") // an operation that does not end
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = end(nil) }()
	req = oneVM("debian")
	req.Owner = "bob"
	req.TTLSeconds = 120
	bob, err := e.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); e.RunReaper(ctx) }()
	defer func() { cancel(); <-done }()
	clk.add(90 * time.Second) // mallory's is due: a pass starts and hangs on it
	time.Sleep(300 * time.Millisecond)
	clk.add(60 * time.Second) // bob's is due now
	start := time.Now()
	for {
		if _, ok := e.Get(bob.ID); !ok {
			break
		}
		if time.Since(start) > 2*teardown {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("bob's expired sandbox deleted %v after it was due (reaper interval 50ms, teardown timeout %v)", took.Round(time.Millisecond), teardown)
	if took > time.Second {
		t.Errorf("bob's expired sandbox waited %v for mallory's hung delete: the reaper's pass is a barrier", took.Round(time.Millisecond))
	}
}
