package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestReapPassIsNoBarrier: RunReaper does not wait for the deletes it
// started before it starts the next ones. One sandbox whose delete hangs
// (an operation that does not end) holds its own slot for its
// TeardownTimeout, while another owner's sandbox that expires meanwhile
// is deleted within a few reaper intervals of its expiry.
func TestReapPassIsNoBarrier(t *testing.T) {
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
