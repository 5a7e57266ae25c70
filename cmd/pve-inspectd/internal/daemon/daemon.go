// Package daemon wires the parts of `pve-inspectd run`: the host guard, the
// egress lockdown with its halt, the metrics listener, systemd notification
// (READY, WATCHDOG, STOPPING) and (later) the sandbox API. Each part gets its
// config and a logger with a component attribute; the order of start-up is the order of trust: nothing
// is served and nothing is reported ready before the guard is verified in
// force.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/lockdown"
	"github.com/pve-inspect/pve-inspect/lockdown/halt"
	"github.com/pve-inspect/pve-inspect/sandboxapi/qga"
	"github.com/pve-inspect/pve-inspect/sandboxapi/qgaguest"
)

// lockedDown adapts a func to the check's view of the lockdown.
type lockedDown func() bool

// LockedDown reports whether the lockdown is asked for and in force.
func (f lockedDown) LockedDown() bool { return f() }

// GuardConfig turns the [guard] section into the firewall's configuration.
func GuardConfig(s config.GuardSection) firewall.Config {
	return firewall.Config{
		Metadata4:      s.Metadata4Prefixes(),
		Metadata6:      s.Metadata6Prefixes(),
		Private4Allow:  s.Private4AllowPrefixes(),
		Trusted:        s.Trusted,
		Zones:          s.Zones,
		DnsmasqUser:    s.DnsmasqUser,
		VerifyInterval: s.VerifyEvery(),
		ProcRoot:       s.ProcRoot,
		StateDir:       s.StateDir,
	}
}

// HaltConfig turns the [halt] section into the halt's configuration.
func HaltConfig(s config.HaltSection) halt.Config {
	return halt.Config{Units: s.Units, StateFile: s.StateFile, Transport: halt.Transport(s.Transport)}
}

// Daemon is `pve-inspectd run`.
type Daemon struct {
	Config config.Config
	Log    *slog.Logger
	// GuardOptions are passed to firewall.New (tests: a network namespace).
	GuardOptions []firewall.Option
	// Ready is called once, after the guard is verified in force and every
	// listener is bound (tests).
	Ready func()
	// Notify, when set, gets READY=1 at the same moment as Ready, a
	// WATCHDOG=1 every half WatchdogSec while the daemon is healthy, and
	// STOPPING=1 when Run begins to stop. Systemd{} in production.
	Notify Notifier
	// MetricsAddr, when non-nil, receives the bound metrics address (tests,
	// listen port 0).
	MetricsAddr func(net.Addr)
}

// Run starts every part, reports readiness, and blocks until ctx is done or
// a part fails. The guard's table stays in the kernel when Run returns.
func (d *Daemon) Run(ctx context.Context) error {
	log := d.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// 1. Host guard: in force and verified before anything else. A restart
	//    while the lockdown is asked for starts it with the lockdown on, so
	//    adopting the orphaned table never empties the lockdown sets.
	lopt := LockdownOptions(d.Config.Lockdown)
	initial := StartSwitches(lopt.Marker, lopt.StateFile)
	guard, err := firewall.New(GuardConfig(d.Config.Guard),
		append([]firewall.Option{firewall.WithLogger(log), firewall.WithSwitches(initial)}, d.GuardOptions...)...)
	if err != nil {
		return fmt.Errorf("guard: %w", err)
	}
	defer guard.Close()
	if err := guard.Start(ctx); err != nil {
		return fmt.Errorf("guard: %w", err)
	}
	if err := guard.Verify(ctx); err != nil {
		return fmt.Errorf("guard not in force: %w", err)
	}

	reg := prometheus.NewRegistry()
	if err := reg.Register(guard.Collector()); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	// 1b. Zones: the sandbox API's and Proxmox's applied SDN config's,
	//     merged into the guard's run-time zones.
	zones := newZoneUnion(guard.SetZones)
	sdnRun, err := StartSDNZones(ctx, d.Config.Guard, log, reg, zones.source("sdn"), guard)
	if err != nil {
		return fmt.Errorf("sdn zones: %w", err)
	}
	errc := make(chan error, 8)
	running := 0
	var stops []func() // run in reverse order when a part ends or ctx is done

	// 2. Egress lockdown: marker-gated, with the fail-deadly halt. Its first
	//    reconcile happens before readiness.
	halter, err := halt.New(HaltConfig(d.Config.Halt), log, reg)
	if err != nil {
		return fmt.Errorf("halt: %w", err)
	}
	lmetrics, err := lockdown.NewMetrics(reg)
	if err != nil {
		return fmt.Errorf("lockdown metrics: %w", err)
	}
	lopt.Guard, lopt.Halter, lopt.Metrics, lopt.Logger = guard, halter, lmetrics, log
	ctl, err := lockdown.New(lopt)
	if err != nil {
		return fmt.Errorf("lockdown: %w", err)
	}
	running++
	go func() {
		err := ctl.Run(ctx)
		if err != nil {
			err = fmt.Errorf("lockdown: %w", err)
		}
		errc <- err
	}()
	select {
	case <-ctl.Synced():
	case err := <-errc:
		if err == nil {
			err = errors.New("lockdown: stopped before its first reconcile")
		}
		return err
	case <-ctx.Done():
		cancel()
		<-errc
		return ctx.Err()
	}

	// 3. Metrics.
	if addr := d.Config.Metrics.Listen; addr != "" {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("metrics: listen %s: %w", addr, err)
		}
		if d.MetricsAddr != nil {
			d.MetricsAddr(ln.Addr())
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		running++
		go func() {
			err := srv.Serve(ln)
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
			errc <- fmt.Errorf("metrics: %w", err)
		}()
		stops = append(stops, func() {
			sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer scancel()
			_ = srv.Shutdown(sctx)
		})
		log.Info("metrics listening", "component", "metrics", "addr", ln.Addr().String())
	}

	// 4. Sandbox API: Proxmox through the daemon's pool-limited token,
	//    guest I/O straight to the agent sockets, the containment check.
	if d.Config.API.Enabled {
		qc := qga.New(qga.Options{})
		chk := NewChecker(d.Config, qc, lockedDown(func() bool { s := ctl.State(); return s.Marker && s.Enforced }))
		ifaces := make(chan string, 1)
		sub, unsub := guard.Subscribe()
		stops = append(stops, unsub)
		first := func() string {
			if m := guard.Management(); len(m) > 0 {
				return m[0]
			}
			return ""
		}
		running++
		go func() { // forwards default-route interface changes; ends with ctx
			last := first()
			for {
				select {
				case <-ctx.Done():
					errc <- nil
					return
				case <-sub:
					if cur := first(); cur != last && cur != "" {
						last = cur
						select {
						case ifaces <- cur:
						default:
						}
					}
				}
			}
		}()
		api, err := StartAPI(ctx, d.Config, log, APIDeps{Guests: qgaguest.Dialer(qc), Checker: chk, ZonesChanged: zones.source("api"),
			Iface: first(), IfaceChanges: ifaces, Registerer: reg})
		if err != nil {
			cancel()
			for i := len(stops) - 1; i >= 0; i-- {
				stops[i]()
			}
			for ; running > 0; running-- {
				<-errc
			}
			return err
		}
		running++
		go func() {
			err := api.Run(ctx)
			if err != nil {
				err = fmt.Errorf("sandbox api: %w", err)
			}
			errc <- err
		}()
	}

	running++
	go func() {
		err := guard.Run(ctx)
		if err != nil {
			err = fmt.Errorf("guard: %w", err)
		}
		errc <- err
	}()

	if sdnRun != nil {
		running++
		go func() { errc <- sdnRun(ctx) }()
	}

	// 5. Ready: every part above is in force.
	if d.Ready != nil {
		d.Ready()
	}
	stopWatchdog := func() {}
	if d.Notify != nil {
		if err := d.Notify.Notify(notifyReady); err != nil {
			log.Error("cannot report readiness to systemd", "component", "daemon", "err", err)
		}
		// 6. Watchdog: pings only while the health check passes: the
		//    guard's table verified (a wedged guard loop holds the lock
		//    Verify needs, so it blocks and no ping goes out) and the
		//    lockdown's loop publishing states.
		health := func(ctx context.Context) error {
			if err := guard.Verify(ctx); err != nil {
				return fmt.Errorf("guard: %w", err)
			}
			return lockdownFresh(ctl.State(), time.Now(), lopt.Reassert)
		}
		if every, err := d.Notify.WatchdogInterval(); err != nil {
			log.Error("watchdog disabled", "component", "daemon", "err", err)
		} else if every > 0 {
			w := &watchdog{notify: d.Notify, period: every / 2, check: health, log: log}
			wctx, wcancel := context.WithCancel(ctx)
			wdone := make(chan struct{})
			go func() {
				defer close(wdone)
				w.run(wctx)
			}()
			// Stopped before STOPPING=1 is sent, so no ping follows it. A
			// watchdog stuck in a wedged guard's Verify is not waited for
			// long: the process is ending anyway.
			stopWatchdog = func() {
				wcancel()
				select {
				case <-wdone:
				case <-time.After(5 * time.Second):
					log.Warn("watchdog still in its health check at stop", "component", "daemon")
				}
			}
			log.Info("watchdog armed", "component", "daemon", "timeout", every, "ping_every", every/2)
		}
	}
	log.Info("ready", "component", "daemon")

	var first error
	select {
	case <-ctx.Done():
	case first = <-errc:
		running--
		// A part that ends with nil because ctx is done is a normal stop.
		if first == nil && ctx.Err() == nil {
			first = errors.New("a part stopped unexpectedly")
		}
	}
	stopWatchdog()
	if d.Notify != nil {
		if err := d.Notify.Notify(notifyStopping); err != nil {
			log.Warn("cannot report stopping to systemd", "component", "daemon", "err", err)
		}
	}
	cancel()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
	for ; running > 0; running-- {
		<-errc
	}
	return first
}
