package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// DefaultBuildTimeout bounds a build from its first step to its template
// (Options.Timeout; [templates] build_timeout, --build-timeout): room for
// a download of several GiB over a slow link (Proxmox's, or the build's
// own of an archive), the import, the first boot's waits for the agent
// and cloud-init (30 minutes each by default) and the seal.
const DefaultBuildTimeout = 4 * time.Hour

// TimeoutError is the failure of a build stopped by its Timeout: the
// limit, and the step it was in (the step of its last progress line:
// image, create, agent, cloud-init, seal, ...). It wraps
// context.DeadlineExceeded.
type TimeoutError struct {
	Limit time.Duration
	Step  string
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("the build was stopped in step %s: it ran longer than its %s ([templates] build_timeout, --build-timeout)", e.Step, e.Limit)
}

// Unwrap makes a TimeoutError a deadline exceeded.
func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

// stepTracker is the step a build is in, as its last progress line names
// it: written by say (from the build's goroutine, and from the upload's
// reader on the HTTP client's), read by the deadline's timer.
type stepTracker struct{ v atomic.Value }

func (s *stepTracker) set(step string) { s.v.Store(step) }

func (s *stepTracker) get() string {
	if v, ok := s.v.Load().(string); ok {
		return v
	}
	return "find"
}

// withDeadline is ctx ended, when Options.Timeout passes, with a
// *TimeoutError naming the step the build is in then as its cause. It
// ends as a cancel does (ctx.Err() is context.Canceled): every call of
// the build returns, its locks and slot are released by their owners,
// and what a cancelled build leaves (a VM tagged building under
// KeepCancelled, an image downloaded whole) is left the same way for the
// next build of the name. stop releases the timer.
func (b *Builder) withDeadline(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	timer := time.AfterFunc(b.o.Timeout, func() {
		cancel(&TimeoutError{Limit: b.o.Timeout, Step: b.step.get()})
	})
	return ctx, func() {
		timer.Stop()
		cancel(nil)
	}
}

// timedOut is err, the failure of a build whose context is ctx, said as
// its timeout when that is what ended it.
func timedOut(ctx context.Context, err error) error {
	var te *TimeoutError
	if err == nil || errors.As(err, &te) || !errors.As(context.Cause(ctx), &te) {
		return err
	}
	return fmt.Errorf("%w: %w", te, err)
}
