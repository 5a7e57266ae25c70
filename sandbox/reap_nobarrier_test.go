package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestReapPassIsNoBarrier: RunReaper does not wait for the deletes it
// started before it starts the next ones. One sandbox whose delete hangs
// (an operation that does not end) holds its own slot for its
// TeardownTimeout, while another owner's sandbox that expires meanwhile
// is deleted long before that timeout ends (a reaper pass that waited for
// its deletes would hold bob's for the whole TeardownTimeout, past the
// test's minute).
func TestReapPassIsNoBarrier(t *testing.T) {
	const teardown = 10 * time.Minute
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
	waitSandbox(t, e, m.ID, func(sb apitype.Sandbox, ok bool) bool { return ok && sb.State == apitype.StateDeleting })
	clk.add(60 * time.Second) // bob's is due now
	waitSandbox(t, e, bob.ID, func(_ apitype.Sandbox, ok bool) bool { return !ok })
	if sb, ok := e.Get(m.ID); !ok || sb.State != apitype.StateDeleting {
		t.Errorf("mallory's sandbox %+v (there: %v), want its delete still hanging on the operation", sb, ok)
	}
}

// waitSandbox polls sandbox id until cond holds of it (a minute).
func waitSandbox(t *testing.T, e *sandbox.Engine, id string, cond func(sb apitype.Sandbox, ok bool) bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		sb, ok := e.Get(id)
		if cond(sb, ok) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s after a minute: %+v (there: %v)", id, sb, ok)
		}
	}
}
