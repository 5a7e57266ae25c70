package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"

	"github.com/pve-inspect/pve-inspect/lockdown"
)

// Notifier tells the service manager about the daemon's state (the
// sd_notify protocol of a Type=notify unit).
type Notifier interface {
	// Notify sends one or more newline-separated state assignments
	// ("READY=1", "WATCHDOG=1", "STOPPING=1", "STATUS=...").
	Notify(state string) error
	// WatchdogInterval returns the unit's WatchdogSec when the service
	// manager expects keep-alive pings from this process, 0 otherwise.
	WatchdogInterval() (time.Duration, error)
}

// Systemd is the Notifier of a daemon started by systemd: it writes to
// $NOTIFY_SOCKET and reads $WATCHDOG_USEC/$WATCHDOG_PID. Outside systemd
// (no $NOTIFY_SOCKET) every call does nothing.
type Systemd struct{}

// Notify implements Notifier.
func (Systemd) Notify(state string) error {
	_, err := sddaemon.SdNotify(false, state)
	if err != nil {
		return fmt.Errorf("sd_notify %q: %w", state, err)
	}
	return nil
}

// WatchdogInterval implements Notifier.
func (Systemd) WatchdogInterval() (time.Duration, error) {
	d, err := sddaemon.SdWatchdogEnabled(false)
	if err != nil {
		return 0, fmt.Errorf("watchdog settings: %w", err)
	}
	return d, nil
}

// Notification states the daemon sends.
const (
	notifyReady    = sddaemon.SdNotifyReady + "\nSTATUS=guard in force"
	notifyWatchdog = sddaemon.SdNotifyWatchdog
	notifyStopping = sddaemon.SdNotifyStopping + "\nSTATUS=stopping; the guard table stays in the kernel"
)

// watchdog sends WATCHDOG=1 every period, but only after check has passed
// on that tick: a daemon whose guard loop is wedged (check blocks on the
// guard's lock) or whose table is not in force (check fails) stops pinging,
// and systemd kills and restarts it after WatchdogSec. A ping is never sent
// on a timer alone.
type watchdog struct {
	notify Notifier
	period time.Duration
	check  func(context.Context) error
	log    *slog.Logger
}

// run pings until ctx is done. The first check and ping happen at once, so
// the service manager's first deadline is met even right after READY.
func (w *watchdog) run(ctx context.Context) {
	t := time.NewTicker(w.period)
	defer t.Stop()
	for {
		w.tick(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// tick runs one health check and pings when it passes.
func (w *watchdog) tick(ctx context.Context) {
	if err := w.check(ctx); err != nil {
		if ctx.Err() == nil {
			w.log.Warn("unhealthy: withholding the watchdog ping", "component", "watchdog", "err", err)
		}
		return
	}
	if err := w.notify.Notify(notifyWatchdog); err != nil {
		w.log.Warn("watchdog ping failed", "component", "watchdog", "err", err)
	}
}

// lockdownFresh reports whether the lockdown controller's loop is alive: it
// publishes a state at every reconcile, at least once per re-assert period,
// so a state older than three periods means the loop is stuck (a reconcile
// that never returns).
func lockdownFresh(st lockdown.State, now time.Time, reassert time.Duration) error {
	if reassert <= 0 {
		reassert = lockdown.DefaultReassert
	}
	if age := now.Sub(st.Updated); st.Updated.IsZero() || age > 3*reassert {
		return fmt.Errorf("lockdown: no reconcile for %v (re-assert every %v)", age.Round(time.Second), reassert)
	}
	return nil
}
