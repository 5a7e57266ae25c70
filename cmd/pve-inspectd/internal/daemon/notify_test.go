package daemon

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/lockdown"
)

// fakeNotifier records what the daemon sends.
type fakeNotifier struct {
	mu    sync.Mutex
	sent  []string
	pings chan struct{}
}

func (f *fakeNotifier) Notify(state string) error {
	f.mu.Lock()
	f.sent = append(f.sent, state)
	f.mu.Unlock()
	if state == notifyWatchdog && f.pings != nil {
		select {
		case f.pings <- struct{}{}:
		default:
		}
	}
	return nil
}

func (f *fakeNotifier) WatchdogInterval() (time.Duration, error) { return 0, nil }

func (f *fakeNotifier) states() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.sent...)
}

func TestWatchdogTick(t *testing.T) {
	for _, tc := range []struct {
		name  string
		check error
		pings int
	}{
		{"healthy pings", nil, 1},
		{"drift withholds the ping", errors.New("table differs"), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &fakeNotifier{}
			calls := 0
			w := &watchdog{notify: n, period: time.Hour, log: slog.New(slog.DiscardHandler),
				check: func(context.Context) error { calls++; return tc.check }}
			w.tick(context.Background())
			if calls != 1 {
				t.Fatalf("check ran %d times, want 1", calls)
			}
			if got := len(n.states()); got != tc.pings {
				t.Fatalf("sent %q, want %d ping(s)", n.states(), tc.pings)
			}
			for _, s := range n.states() {
				if s != "WATCHDOG=1" {
					t.Fatalf("sent %q, want only WATCHDOG=1", s)
				}
			}
		})
	}
}

// TestWatchdogWedged: a check that blocks (the guard's loop holds its lock)
// means no ping at all, however long the ticker runs; once it unblocks and
// passes, pings resume. The loop stops when its context is done.
func TestWatchdogWedged(t *testing.T) {
	n := &fakeNotifier{pings: make(chan struct{}, 1)}
	release := make(chan struct{})
	var mu sync.Mutex
	checks := 0
	w := &watchdog{notify: n, period: time.Millisecond, log: slog.New(slog.DiscardHandler),
		check: func(ctx context.Context) error {
			mu.Lock()
			checks++
			first := checks == 1
			mu.Unlock()
			if first {
				<-release
			}
			return nil
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.run(ctx); close(done) }()

	// Let the ticker fire many times while the first check is stuck.
	for i := 0; i < 20; i++ {
		time.Sleep(time.Millisecond)
		if len(n.states()) != 0 {
			t.Fatalf("pinged while the health check was blocked: %q", n.states())
		}
	}
	close(release)
	select {
	case <-n.pings:
	case <-time.After(time.Minute):
		t.Fatal("no ping after the check passed")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("watchdog did not stop with its context")
	}
}

// TestWatchdogFollowsCheck: pings follow the check's verdict tick
// by tick.
func TestWatchdogFollowsCheck(t *testing.T) {
	n := &fakeNotifier{}
	verdicts := []error{nil, errors.New("x"), errors.New("y"), nil}
	i := 0
	w := &watchdog{notify: n, period: time.Hour, log: slog.New(slog.DiscardHandler),
		check: func(context.Context) error { v := verdicts[i]; i++; return v }}
	for range verdicts {
		w.tick(context.Background())
	}
	if got := len(n.states()); got != 2 {
		t.Fatalf("sent %d pings for 2 healthy ticks of 4: %q", got, n.states())
	}
}

func TestLockdownFresh(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		updated  time.Time
		reassert time.Duration
		ok       bool
	}{
		{"just reconciled", now.Add(-time.Second), 10 * time.Second, true},
		{"two periods ago", now.Add(-20 * time.Second), 10 * time.Second, true},
		{"stuck", now.Add(-31 * time.Second), 10 * time.Second, false},
		{"never", time.Time{}, 10 * time.Second, false},
		{"default period", now.Add(-25 * time.Second), 0, true},
		{"default period stuck", now.Add(-40 * time.Second), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := lockdownFresh(lockdown.State{Updated: tc.updated}, now, tc.reassert)
			if (err == nil) != tc.ok {
				t.Fatalf("lockdownFresh = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
