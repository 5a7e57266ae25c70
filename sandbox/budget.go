package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// errCreateTimeout ends a create whose own work outlasts CreateTimeout.
var errCreateTimeout = fmt.Errorf("the create's own work took longer than its bound: %w", context.DeadlineExceeded)

// budget is a create's bound on its own work: a timer that stops while the
// create waits for something that is not its work (an SDN apply holding
// the start gate), so that wait is bounded apart (ApplyTimeout).
type budget struct {
	mu     sync.Mutex
	left   time.Duration
	since  time.Time
	timer  *time.Timer
	paused int
	// held: a pause stopped the timer before it fired.
	held bool
}

type budgetKey struct{}

// withBudget returns ctx bounded by d of the create's own work: it ends
// with errCreateTimeout (its Cause; Err is context.Canceled) once d has
// run while not paused (pauseBudget), or when ctx ends.
func withBudget(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	bctx, cancel := context.WithCancelCause(ctx)
	b := &budget{left: d, since: time.Now()}
	b.timer = time.AfterFunc(d, func() { cancel(errCreateTimeout) })
	return context.WithValue(bctx, budgetKey{}, b), func() {
		b.timer.Stop()
		cancel(context.Canceled)
	}
}

// pauseBudget stops ctx's budget, if it has one, until resume is called.
func pauseBudget(ctx context.Context) (resume func()) {
	b, ok := ctx.Value(budgetKey{}).(*budget)
	if !ok {
		return func() {}
	}
	b.mu.Lock()
	if b.paused == 0 && b.timer.Stop() {
		b.left -= time.Since(b.since)
		b.held = true
	}
	b.paused++
	b.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.paused--
			if b.paused == 0 && b.held {
				b.held = false
				b.since = time.Now()
				b.timer.Reset(max(b.left, 0))
			}
		})
	}
}

// budgetErr says that err ended the create because its budget ran out,
// where that is so.
func budgetErr(ctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), errCreateTimeout) && !errors.Is(err, errCreateTimeout) {
		return fmt.Errorf("%w: %w", err, errCreateTimeout)
	}
	return err
}
