// Package daemon wires the parts of `pve-inspectd run`: the host guard, the
// egress lockdown with its halt, the metrics listener, the sandbox API and
// systemd notification (READY, WATCHDOG, STOPPING). Each part gets its
// config and a logger with a component attribute; the order of start-up is
// the order of trust: nothing is served and nothing is reported ready
// before the guard is verified in force. See Daemon.Run for the parts, how
// one is added, and the shutdown order.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vishvananda/netns"
	"golang.org/x/sync/errgroup"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/firewall/portmap"
	"github.com/pve-inspect/pve-inspect/lockdown"
	"github.com/pve-inspect/pve-inspect/lockdown/halt"
	"github.com/pve-inspect/pve-inspect/qga"
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
		Flood:          guardFlood(s),
	}
}

// guardFlood is the flood part of the [guard] section (validated: every
// value is in range).
func guardFlood(s config.GuardSection) firewall.FloodConfig {
	ports := make([]uint16, 0, len(s.ManagementPorts))
	for _, p := range s.ManagementPorts {
		ports = append(ports, uint16(p))
	}
	return firewall.FloodConfig{ManagementPorts: ports, ConnLimit: uint32(s.ConnLimit),
		NodeConnLimit: uint32(s.NodeConnLimit), DNSRate: uint32(s.DNSRate), DNSBurst: uint32(s.DNSBurst),
		PacketRate: uint32(s.PacketRate), PacketBurst: uint32(s.PacketBurst),
		PortARPRate: uint32(s.PortARPRate), PortARPBurst: uint32(s.PortARPBurst),
		PortBroadcastRate: uint32(s.PortBroadcastRate), PortBroadcastBurst: uint32(s.PortBroadcastBurst)}
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
	// EgressNS, when set, is the network namespace the egress resolver and
	// proxy listen and dial in (tests: the guard's namespace).
	EgressNS *netns.NsHandle
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
	// APIRetry, when non-zero, is the first back-off of the sandbox API's
	// attempts to reach Proxmox (tests; default 1s doubling to 30s).
	APIRetry time.Duration
	// API, when non-nil, receives the sandbox API part once built (tests).
	API func(*API)
	// egressHook, when non-nil, receives the egress part once started
	// (tests of this package).
	egressHook func(*Egress)
	// guardHook, when non-nil, receives the guard once in force (tests of
	// this package).
	guardHook func(*firewall.Guard)
}

// run is the state of one Daemon.Run shared by the start functions.
type run struct {
	d     *Daemon
	log   *slog.Logger
	reg   *prometheus.Registry
	guard *firewall.Guard
	zones *zoneUnion // run-time zones by source, handed to the guard
	ctl   *lockdown.Controller
	lopt  lockdown.Options
	parts *parts
	// egressState and egress: the persisted policies and the egress part
	// (egress.go).
	egressState *egress.State
	egress      *Egress
}

// Run starts every part, reports readiness, and blocks until ctx is done or
// a part fails. The guard's table stays in the kernel when Run returns.
//
// Parts start in this order, each by one start function that brings the
// part into force (a failure stops the parts already started and ends Run)
// and hands its loop to the errgroup:
//
//  1. guard: table in force and verified (with the persisted egress
//     policies);
//  2. egress: resolver and peek proxy listening;
//  3. zones: Proxmox's SDN running config read once and in force;
//  4. lockdown: first reconcile done (the halt within it);
//  5. metrics: listener bound;
//  6. management-port rules: converged in the background through the
//     Proxmox API (skipped, and retried, without the daemon's token);
//  7. sandbox API: started in the background and never failing; it answers
//     503 until Proxmox is reachable, so neither the guard nor the lockdown
//     ever waits on Proxmox;
//
// then READY=1, then the watchdog. Adding a part is adding one start
// function to the list in Run.
//
// Shutdown, when ctx ends or any part fails: the watchdog stops (no ping
// after STOPPING=1), STOPPING=1 is sent, then the parts stop one at a time
// in reverse start order, each waited for before the next: API,
// management rules, metrics, lockdown, zones, egress, guard. The guard's
// loop stops last and only between two applied
// states (each apply is one nftables batch), so its table is never left
// half-built; the table persists by design, and Close only releases the
// netlink sockets.
func (d *Daemon) Run(ctx context.Context) error {
	log := d.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g, gctx := errgroup.WithContext(ctx)
	r := &run{d: d, log: log, reg: prometheus.NewRegistry(), parts: &parts{g: g, base: context.WithoutCancel(ctx)}}
	starts := []func(context.Context) error{r.startGuard, r.startEgress, r.startZones, r.startLockdown, r.startMetrics, r.startMgmtRules, r.startAPI}
	for _, start := range starts {
		if err := start(gctx); err != nil {
			r.parts.stop()
			_ = g.Wait()
			return err
		}
	}
	if d.Ready != nil {
		d.Ready()
	}
	stopWatchdog := r.startWatchdog()
	log.Info("ready", "component", "daemon")

	<-gctx.Done()
	stopWatchdog()
	if d.Notify != nil {
		if err := d.Notify.Notify(notifyStopping); err != nil {
			log.Warn("cannot report stopping to systemd", "component", "daemon", "err", err)
		}
	}
	r.parts.stop()
	return g.Wait()
}

// parts runs the loops of the started parts, each with a context of its
// own so they can be stopped one at a time in reverse order.
type parts struct {
	g     *errgroup.Group
	base  context.Context // carries ctx's values, not its cancellation
	stops []func()        // in start order
}

// Go runs loop until the part is stopped. A loop that returns on its own,
// even with nil, is a failure that stops the daemon.
func (p *parts) Go(name string, loop func(context.Context) error) {
	ctx, cancel := context.WithCancel(p.base)
	done := make(chan struct{})
	p.stops = append(p.stops, func() { cancel(); <-done })
	p.g.Go(func() error {
		defer close(done)
		err := loop(ctx)
		switch {
		case err != nil:
			return fmt.Errorf("%s: %w", name, err)
		case ctx.Err() == nil:
			return fmt.Errorf("%s: stopped unexpectedly", name)
		}
		return nil
	})
}

// OnStop registers a clean-up run in reverse start order with the loops.
func (p *parts) OnStop(f func()) { p.stops = append(p.stops, f) }

// stop stops every part in reverse start order, each waited for.
func (p *parts) stop() {
	for i := len(p.stops) - 1; i >= 0; i-- {
		p.stops[i]()
	}
	p.stops = nil
}

// startGuard brings the host guard into force. A restart while the lockdown
// is asked for starts it with the lockdown on, so adopting the orphaned
// table never empties the lockdown sets.
func (r *run) startGuard(ctx context.Context) error {
	r.lopt = LockdownOptions(r.d.Config.Lockdown)
	initial := StartSwitches(r.lopt.Marker, r.lopt.StateFile)
	fc, eopts, err := r.egressAtStart()
	if err != nil {
		return fmt.Errorf("guard: %w", err)
	}
	guard, err := firewall.New(fc,
		append(append([]firewall.Option{firewall.WithLogger(r.log), firewall.WithSwitches(initial)}, eopts...), r.d.GuardOptions...)...)
	if err != nil {
		return fmt.Errorf("guard: %w", err)
	}
	// The layer-2 guard's port map is read before Start, so that a
	// rebuilt or new bridge table pins the running guests from its first
	// batch instead of holding them to DHCP until the first remap.
	mp := &portmap.Mapper{Paths: portmap.Paths{Root: r.d.Config.Guard.NodeRoot}, Guard: guard, Log: r.log}
	if _, err := mp.Once(ctx); errors.Is(err, portmap.ErrNoVMConfigs) {
		r.log.Debug("no VM configs yet; the port map waits for them", "component", "portmap", "err", err)
	} else if err != nil {
		r.log.Warn("cannot map guest ports before start; unmapped ports stay DHCP-only", "component", "portmap", "err", err)
	}
	if err := guard.Start(ctx); err != nil {
		guard.Close()
		return fmt.Errorf("guard: %w", err)
	}
	if err := guard.Verify(ctx); err != nil {
		guard.Close()
		return fmt.Errorf("guard not in force: %w", err)
	}
	if err := r.reg.Register(guard.Collector()); err != nil {
		guard.Close()
		return fmt.Errorf("metrics: %w", err)
	}
	r.guard = guard
	if r.d.guardHook != nil {
		r.d.guardHook(guard)
	}
	r.parts.OnStop(func() { guard.Close() }) // after the loop below has stopped
	r.parts.Go("guard", guard.Run)
	r.parts.Go("portmap", mp.Run) // keeps the port map current
	return nil
}

// startLockdown starts the marker-gated egress lockdown with its
// fail-deadly halt and waits for its first reconcile.
func (r *run) startLockdown(ctx context.Context) error {
	halter, err := halt.New(HaltConfig(r.d.Config.Halt), r.log, r.reg)
	if err != nil {
		return fmt.Errorf("halt: %w", err)
	}
	lmetrics, err := lockdown.NewMetrics(r.reg)
	if err != nil {
		return fmt.Errorf("lockdown metrics: %w", err)
	}
	r.lopt.Guard, r.lopt.Halter, r.lopt.Metrics, r.lopt.Logger = r.guard, halter, lmetrics, r.log
	ctl, err := lockdown.New(r.lopt)
	if err != nil {
		return fmt.Errorf("lockdown: %w", err)
	}
	r.ctl = ctl
	r.parts.Go("lockdown", ctl.Run)
	select {
	case <-ctl.Synced():
		return nil
	case <-ctx.Done(): // the lockdown (or another part) ended, or Run's ctx
		return fmt.Errorf("lockdown: stopped before its first reconcile: %w", context.Cause(ctx))
	}
}

// startMetrics binds the metrics listener.
func (r *run) startMetrics(ctx context.Context) error {
	addr := r.d.Config.Metrics.Listen
	if addr == "" {
		return nil
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: listen %s: %w", addr, err)
	}
	if r.d.MetricsAddr != nil {
		r.d.MetricsAddr(ln.Addr())
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	r.parts.Go("metrics", func(ctx context.Context) error {
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(ln) }()
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			<-errc
			return nil
		}
	})
	r.log.Info("metrics listening", "component", "metrics", "addr", ln.Addr().String())
	return nil
}

// startAPI starts the sandbox API in the background: Proxmox through the
// daemon's pool-limited token, guest I/O straight to the agent sockets, the
// containment check. It only fails on a programming error (metrics).
func (r *run) startAPI(context.Context) error {
	cfg := r.d.Config
	if !cfg.API.Enabled {
		return nil
	}
	qc := qga.New(qga.Options{ExecOwnSession: cfg.API.ExecOwnSession, Budget: qga.NewBudget(cfg.API.GuestBufferBytes, cfg.API.OwnerGuestBufferBytes)})
	ctl := r.ctl
	chk := NewChecker(cfg, qc, lockedDown(func() bool { s := ctl.State(); return s.Marker && s.Enforced }), r.egress)
	api, err := NewAPI(cfg, r.log, APIDeps{Guests: qc.SandboxGuests(), WinGuests: qc.WindowsGuests(), Checker: chk, ZonesChanged: r.zones.source("api"),
		Egress: r.egress, Registerer: r.reg, RetryMin: r.d.APIRetry, HostInterfaces: guardInterfaces(r.guard)})
	if err != nil {
		return err
	}
	if r.d.API != nil {
		r.d.API(api)
	}
	r.parts.Go("sandbox api", api.Run)
	return nil
}

// startWatchdog sends READY=1 and arms the watchdog; it returns the stop of
// the watchdog. The watchdog pings only while the health check passes: the
// guard's table verified (a wedged guard loop holds the lock Verify needs,
// so it blocks and no ping goes out) and the lockdown's loop publishing
// states.
func (r *run) startWatchdog() (stop func()) {
	d, log := r.d, r.log
	if d.Notify == nil {
		return func() {}
	}
	if err := d.Notify.Notify(notifyReady); err != nil {
		log.Error("cannot report readiness to systemd", "component", "daemon", "err", err)
	}
	every, err := d.Notify.WatchdogInterval()
	if err != nil {
		log.Error("watchdog disabled", "component", "daemon", "err", err)
		return func() {}
	}
	if every <= 0 {
		return func() {}
	}
	health := func(ctx context.Context) error {
		if err := r.guard.Verify(ctx); err != nil {
			return fmt.Errorf("guard: %w", err)
		}
		return lockdownFresh(r.ctl.State(), time.Now(), r.lopt.Reassert)
	}
	w := &watchdog{notify: d.Notify, period: every / 2, check: health, log: log}
	wctx, wcancel := context.WithCancel(context.Background())
	wdone := make(chan struct{})
	go func() {
		defer close(wdone)
		w.run(wctx)
	}()
	log.Info("watchdog armed", "component", "daemon", "timeout", every, "ping_every", every/2)
	// Stopped before STOPPING=1 is sent, so no ping follows it. A watchdog
	// stuck in a wedged guard's Verify is not waited for long: the process
	// is ending anyway.
	return func() {
		wcancel()
		select {
		case <-wdone:
		case <-time.After(5 * time.Second):
			log.Warn("watchdog still in its health check at stop", "component", "daemon")
		}
	}
}

// guardInterfaces names the guard's management and trusted interfaces as
// classified now (nil without a guard).
func guardInterfaces(g *firewall.Guard) func() []string {
	if g == nil {
		return nil
	}
	return func() []string {
		c := g.Classification()
		return append(slices.Clone(c.Management), c.Trusted...)
	}
}
