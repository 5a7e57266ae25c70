package lockdown

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Default paths and timing.
const (
	// DefaultMarker is the marker file that asks for the lockdown; the same
	// path as the reference scripts, so existing runbooks keep working.
	DefaultMarker = "/etc/inspect-proxmox-egress-lockdown"
	// DefaultResolver is the resolver file the SDN dnsmasq instances forward
	// through.
	DefaultResolver = "/run/dnsmasq/resolv.conf"
	// DefaultBackupDir holds the resolver backup while the lockdown is on.
	DefaultBackupDir = "/run/pve-inspectd"
	// DefaultStateFile is where the controller publishes its [State].
	DefaultStateFile = "/run/pve-inspectd/lockdown.json"
	// DefaultReassert is the period of the re-assert backstop.
	DefaultReassert = 10 * time.Second
)

// Halt reasons the controller passes to [Halter.Halt]. They are short and
// stable (fit for a metric label); the details go to the log and [State].
const (
	ReasonNoDefaultRoute = "no-default-route"
	ReasonFailClosed     = "fail-closed-refused"
	ReasonCommitRefused  = "commit-refused"
	ReasonResolverBlank  = "dns-blanking-failed"
	ReasonVerifyFailed   = "verify-failed"
)

// Guard is the part of the host guard (package firewall) the controller
// drives. Every method must be safe to call repeatedly with the same value.
type Guard interface {
	// SetLockdown fills (on) or empties (off) the lockdown rules' interface
	// set with the management interfaces, in one committed batch.
	SetLockdown(ctx context.Context, on bool) error
	// SetFailClosed enables or disables the blanket forward drop.
	SetFailClosed(ctx context.Context, on bool) error
	// Management lists the interfaces that carry a default route now.
	Management() []string
	// Verify compares the kernel's table with the desired one.
	Verify(ctx context.Context) error
	// Subscribe returns a channel that receives a value (coalesced, never
	// blocking the sender) whenever the interface classification changes,
	// and a function that ends the subscription.
	Subscribe() (<-chan struct{}, func())
}

// Halter stops the node's control plane (fail deadly, package
// lockdown/halt). It must be idempotent.
type Halter interface {
	Halt(ctx context.Context, reason string) error
}

// Reloader tells the SDN dnsmasq instances to re-read the resolver file and
// drop their cache. [ProcSignaler] is the real one.
type Reloader interface {
	// Reload returns how many processes it signalled.
	Reload(ctx context.Context) (int, error)
}

// Options configure a [Controller]. Zero values take the defaults above.
type Options struct {
	Marker    string        // marker file; DefaultMarker
	Resolver  string        // resolver file; DefaultResolver
	BackupDir string        // resolver backup directory; DefaultBackupDir
	StateFile string        // state file; DefaultStateFile; "-" = none
	Reassert  time.Duration // re-assert backstop period; DefaultReassert

	Guard    Guard    // required
	Halter   Halter   // required
	Reloader Reloader // nil = ProcSignaler{Matcher: DefaultMatcher(Resolver)}
	Metrics  *Metrics // nil = no metrics
	Logger   *slog.Logger
}

// Controller is the lockdown controller. Create it with [New] and run it
// with [Controller.Run].
type Controller struct {
	opt      Options
	resolver *resolverFile
	log      *slog.Logger
	kick     chan struct{}

	mu     sync.Mutex
	state  State
	synced chan struct{} // closed after the first reconcile
	once   sync.Once

	// Owned by the Run goroutine.
	lastMarker  bool
	markerSince time.Time // first event of the batch that showed the marker
	needReload  bool
	failing     bool
	haltedFor   string
	running     bool
}

// New checks the options and returns a controller. It touches nothing.
func New(opt Options) (*Controller, error) {
	if opt.Guard == nil {
		return nil, errors.New("lockdown: no guard")
	}
	if opt.Halter == nil {
		return nil, errors.New("lockdown: no halter")
	}
	if opt.Marker == "" {
		opt.Marker = DefaultMarker
	}
	if opt.Resolver == "" {
		opt.Resolver = DefaultResolver
	}
	if opt.BackupDir == "" {
		opt.BackupDir = DefaultBackupDir
	}
	if opt.StateFile == "" {
		opt.StateFile = DefaultStateFile
	}
	if opt.Reassert == 0 {
		opt.Reassert = DefaultReassert
	}
	if opt.Reassert < 0 {
		return nil, fmt.Errorf("lockdown: negative re-assert interval %v", opt.Reassert)
	}
	for name, p := range map[string]string{"marker": opt.Marker, "resolver": opt.Resolver, "backup dir": opt.BackupDir} {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("lockdown: %s path %q is not absolute", name, p)
		}
	}
	opt.Marker = filepath.Clean(opt.Marker)
	opt.Resolver = filepath.Clean(opt.Resolver)
	if opt.Marker == opt.Resolver {
		return nil, errors.New("lockdown: marker and resolver are the same file")
	}
	if opt.Reloader == nil {
		opt.Reloader = ProcSignaler{Matcher: DefaultMatcher(opt.Resolver)}
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	return &Controller{
		opt:      opt,
		resolver: newResolverFile(opt.Resolver, opt.BackupDir, opt.Marker),
		log:      opt.Logger.With("component", "lockdown"),
		kick:     make(chan struct{}, 1),
		synced:   make(chan struct{}),
	}, nil
}

// Synced is closed once Run's first reconcile has published its state
// (the daemon reports ready after it; check [Controller.State] for the
// outcome).
func (c *Controller) Synced() <-chan struct{} { return c.synced }

// State returns the state published by the last reconcile.
func (c *Controller) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.state
	s.Management = slices.Clone(s.Management)
	return s
}

// Kick asks the running controller for a reconcile (coalesced, never
// blocks).
func (c *Controller) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run watches and reconciles until ctx is done. It reconciles once at the
// start (then Synced is closed). Do not run it twice at the same time. It leaves the lockdown as it is when it returns: a daemon that
// stops does not lift a lockdown. It returns nil when ctx ends, and an
// error only when it cannot watch at all.
func (c *Controller) Run(ctx context.Context) error {
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("lockdown: watch: %w", err)
	}
	defer watcher.Close()
	events, errs := watcher.Events, watcher.Errors
	guardCh, cancel := c.opt.Guard.Subscribe()
	defer cancel()
	ticker := time.NewTicker(c.opt.Reassert)
	defer ticker.Stop()

	_, watchErr := c.ensureWatches(watcher)
	c.reconcile(ctx, time.Time{}, true, watchErr)
	c.once.Do(func() { close(c.synced) })
	if added, _ := c.ensureWatches(watcher); added {
		c.Kick()
	}
	for {
		var since time.Time
		tick := false
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return errors.New("lockdown: watcher closed")
			}
			if !c.relevant(ev) {
				continue
			}
			since = time.Now()
		case err, ok := <-errs:
			if !ok {
				return errors.New("lockdown: watcher closed")
			}
			// An overflow loses events: reconcile from the file system.
			c.log.Warn("watch error", "err", err)
			since = time.Now()
		case <-guardCh:
		case <-c.kick:
		case <-ticker.C:
			tick = true
		}
	drain:
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					break drain
				}
				if since.IsZero() && c.relevant(ev) {
					since = time.Now()
				}
			case <-errs:
			case <-guardCh:
			case <-c.kick:
			case <-ticker.C:
				tick = true
			default:
				break drain
			}
		}
		_, watchErr = c.ensureWatches(watcher)
		c.reconcile(ctx, since, tick, watchErr)
		// The reconcile may have created the resolver's directory: watch it
		// now and look once more, so a rewrite in between is not missed.
		if added, _ := c.ensureWatches(watcher); added {
			c.Kick()
		}
	}
}

// relevant reports whether a file system event concerns the marker, the
// resolver file or one of their directories.
func (c *Controller) relevant(ev fsnotify.Event) bool {
	switch filepath.Clean(ev.Name) {
	case c.opt.Marker, c.opt.Resolver, filepath.Dir(c.opt.Marker), filepath.Dir(c.opt.Resolver):
		return true
	}
	return false
}

// ensureWatches (re)adds the watches on the marker's and the resolver's
// directories; a directory that vanished loses its watch, so this runs
// before every reconcile. added reports whether it added one.
func (c *Controller) ensureWatches(w *fsnotify.Watcher) (added bool, err error) {
	have := w.WatchList()
	var errs []error
	for _, dir := range []string{filepath.Dir(c.opt.Marker), filepath.Dir(c.opt.Resolver)} {
		if slices.Contains(have, dir) {
			continue
		}
		if err := w.Add(dir); err != nil {
			if errors.Is(err, os.ErrNotExist) && dir == filepath.Dir(c.opt.Resolver) {
				continue // re-added once the lockdown creates it
			}
			errs = append(errs, fmt.Errorf("watch %s: %w", dir, err))
			continue
		}
		have = append(have, dir)
		added = true
	}
	return added, errors.Join(errs...)
}

// reconcile brings the node to the state the marker asks for and publishes
// the result. since is when the first event of this batch arrived (zero for
// ticks and start-up); tick marks a backstop pass.
func (c *Controller) reconcile(ctx context.Context, since time.Time, tick bool, watchErr error) {
	// Updated is taken before the marker is read: a state updated after a
	// moment reflects the marker as it was at or after that moment.
	st := State{PID: os.Getpid(), Updated: time.Now().UTC()}
	marker, markerErr := MarkerPresent(c.opt.Marker)
	st.Marker = marker
	if marker && !c.lastMarker {
		c.markerSince = since
	}
	if !marker {
		c.markerSince = time.Time{}
	}
	c.lastMarker = marker

	var f failures
	if markerErr != nil {
		// Counted as present; enforcing is the safe side, not a halt.
		st.Warnings = append(st.Warnings, markerErr.Error())
	}
	if watchErr != nil {
		// Not a halt: the re-assert tick still enforces. Reported only.
		st.Warnings = append(st.Warnings, watchErr.Error())
	}
	if marker {
		c.enforce(ctx, &st, &f)
		c.haltIfNeeded(ctx, &st, &f, tick)
		st.Enforced = f.empty()
	} else {
		c.lift(ctx, &st, &f)
		c.failing = false
	}
	st.Converged = f.empty()
	st.Reason = f.String()
	st.Halted = c.haltedFor
	blanked, _ := c.resolver.Blanked()
	st.ResolverBlanked = blanked

	prev := c.State()
	if st.Converged {
		st.LastAssert = st.Updated
	} else {
		st.LastAssert = prev.LastAssert
	}
	var latency time.Duration
	if st.Enforced && !c.markerSince.IsZero() {
		latency = time.Since(c.markerSince)
		c.markerSince = time.Time{}
		st.LastLatencySeconds = latency.Seconds()
	} else {
		st.LastLatencySeconds = prev.LastLatencySeconds
	}

	if !st.Converged || prev.Enforced != st.Enforced || prev.Marker != st.Marker || !c.running {
		level := slog.LevelInfo
		if !st.Converged {
			level = slog.LevelError
		}
		c.log.Log(ctx, level, "lockdown reconciled", "marker", st.Marker, "enforced", st.Enforced,
			"converged", st.Converged, "fail_closed", st.FailClosed, "resolver_blanked", st.ResolverBlanked,
			"management", strings.Join(st.Management, ","), "reason", st.Reason)
	}
	c.running = true

	// Metrics and the state file first: whoever sees the new State sees
	// them too.
	c.opt.Metrics.observe(st, latency)
	if c.opt.StateFile != "-" {
		if err := WriteState(c.opt.StateFile, st); err != nil {
			c.log.Warn("write state file", "err", err)
		}
	}
	c.mu.Lock()
	c.state = st
	c.mu.Unlock()
}

// enforce puts the lockdown in force and proves it, recording what failed.
func (c *Controller) enforce(ctx context.Context, st *State, f *failures) {
	g := c.opt.Guard
	st.Management = slices.Clone(g.Management())
	slices.Sort(st.Management)
	// Fail closed first: with no management interface the lockdown set is
	// empty and only the blanket drop stops forwarding.
	if len(st.Management) == 0 {
		if err := retry(ctx, func() error { return g.SetFailClosed(ctx, true) }); err != nil {
			f.add(ReasonFailClosed, fmt.Errorf("enable blanket forward drop: %w", err))
		} else {
			st.FailClosed = true
		}
		f.add(ReasonNoDefaultRoute, errors.New("no interface carries a default route"))
	}
	if err := retry(ctx, func() error { return g.SetLockdown(ctx, true) }); err != nil {
		f.add(ReasonCommitRefused, fmt.Errorf("lockdown rules: %w", err))
	}
	if len(st.Management) > 0 {
		if err := g.SetFailClosed(ctx, false); err != nil {
			// The blanket drop staying on is safe; report it only.
			st.FailClosed = true
			st.Warnings = append(st.Warnings, fmt.Sprintf("disable blanket forward drop: %v", err))
		}
	}

	changed, err := c.resolver.Blank()
	if err != nil {
		f.add(ReasonResolverBlank, err)
	}
	if changed {
		c.needReload = true
		c.opt.Metrics.resolverBlanked()
	}
	if c.needReload {
		if err := c.reload(ctx); err != nil {
			f.add(ReasonResolverBlank, err)
		}
	}

	if f.empty() {
		err := g.Verify(ctx)
		if err != nil {
			// One repair attempt: commit again, verify again.
			if rerr := g.SetLockdown(ctx, true); rerr != nil {
				err = errors.Join(err, fmt.Errorf("re-commit: %w", rerr))
			} else {
				err = g.Verify(ctx)
			}
		}
		if err != nil {
			f.add(ReasonVerifyFailed, fmt.Errorf("verify guard table: %w", err))
		}
	}
}

// lift ends the lockdown and restores the resolver file.
func (c *Controller) lift(ctx context.Context, st *State, f *failures) {
	g := c.opt.Guard
	st.Management = slices.Clone(g.Management())
	slices.Sort(st.Management)
	if err := g.SetLockdown(ctx, false); err != nil {
		f.add("lift", fmt.Errorf("lockdown rules off: %w", err))
	}
	if err := g.SetFailClosed(ctx, false); err != nil {
		st.FailClosed = true
		f.add("lift", fmt.Errorf("blanket forward drop off: %w", err))
	}
	changed, err := c.resolver.Restore()
	if err != nil {
		f.add("lift", err)
	}
	if changed {
		c.needReload = true
	}
	if c.needReload {
		if err := c.reload(ctx); err != nil {
			f.add("lift", err)
		}
	}
}

// reload signals dnsmasq and clears needReload on success.
func (c *Controller) reload(ctx context.Context) error {
	n, err := c.opt.Reloader.Reload(ctx)
	c.opt.Metrics.reloaded(n)
	if err != nil {
		return fmt.Errorf("reload dnsmasq: %w", err)
	}
	c.needReload = false
	c.log.Debug("dnsmasq reloaded", "processes", n)
	return nil
}

// haltIfNeeded halts when the lockdown is asked for but not proven in
// force: on entering the failing state, when the reason changes, and on
// every backstop tick while it lasts (an operator's premature recover is
// undone).
func (c *Controller) haltIfNeeded(ctx context.Context, st *State, f *failures, tick bool) {
	if f.empty() {
		c.failing = false
		return
	}
	reason := f.first()
	if c.failing && c.haltedFor == reason && !tick {
		return
	}
	c.failing = true
	c.log.Error("lockdown cannot be proven in force: halting", "reason", reason, "detail", f.String())
	if err := c.opt.Halter.Halt(ctx, reason); err != nil {
		st.Warnings = append(st.Warnings, fmt.Sprintf("halt failed: %v", err))
		c.log.Error("halt failed", "reason", reason, "err", err)
		c.failing = false // try again on the next reconcile
		return
	}
	c.haltedFor = reason
}

// retry runs fn, and once more if it fails.
func retry(ctx context.Context, fn func() error) error {
	err := fn()
	if err == nil || ctx.Err() != nil {
		return err
	}
	return fn()
}

// failures collects what stands between the node and the state asked for.
type failures struct {
	reasons []string
	errs    []error
}

func (f *failures) add(reason string, err error) {
	f.reasons = append(f.reasons, reason)
	f.errs = append(f.errs, err)
}

func (f *failures) empty() bool { return len(f.errs) == 0 }

func (f *failures) first() string {
	if f.empty() {
		return ""
	}
	return f.reasons[0]
}

func (f *failures) String() string {
	parts := make([]string, len(f.errs))
	for i, err := range f.errs {
		parts[i] = f.reasons[i] + ": " + err.Error()
	}
	return strings.Join(parts, "; ")
}
