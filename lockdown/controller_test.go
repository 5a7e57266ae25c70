package lockdown

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeGuard records what the controller asks of the host guard.
type fakeGuard struct {
	mu                        sync.Mutex
	lockdown, failClosed      bool
	mgmt                      []string
	lockdownErr, failErr      error
	verifyErr                 error
	setLockdownN, failClosedN int
	subs                      []chan struct{}
}

func (g *fakeGuard) SetLockdown(_ context.Context, on bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.setLockdownN++
	if g.lockdownErr != nil {
		return g.lockdownErr
	}
	g.lockdown = on
	return nil
}

func (g *fakeGuard) SetFailClosed(_ context.Context, on bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failClosedN++
	if g.failErr != nil {
		return g.failErr
	}
	g.failClosed = on
	return nil
}

func (g *fakeGuard) Management() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.mgmt)
}

func (g *fakeGuard) Verify(context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.verifyErr
}

func (g *fakeGuard) Subscribe() (<-chan struct{}, func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch := make(chan struct{}, 1)
	g.subs = append(g.subs, ch)
	return ch, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.subs = slices.DeleteFunc(g.subs, func(c chan struct{}) bool { return c == ch })
	}
}

// setMgmt changes the classification and notifies subscribers.
func (g *fakeGuard) setMgmt(ifaces ...string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.mgmt = ifaces
	for _, ch := range g.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (g *fakeGuard) get() (lockdown, failClosed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lockdown, g.failClosed
}

// fakeHalter records halt reasons.
type fakeHalter struct {
	mu      sync.Mutex
	reasons []string
}

func (h *fakeHalter) Halt(_ context.Context, reason string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reasons = append(h.reasons, reason)
	return nil
}

func (h *fakeHalter) got() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.reasons)
}

// fakeReloader counts reloads.
type fakeReloader struct {
	mu sync.Mutex
	n  int
}

func (r *fakeReloader) Reload(context.Context) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	return 1, nil
}

func (r *fakeReloader) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// env is one controller under test with its temporary file system.
type env struct {
	t                        *testing.T
	dir                      string
	marker, resolver, backup string
	state                    string
	guard                    *fakeGuard
	halter                   *fakeHalter
	reloader                 *fakeReloader
	reg                      *prometheus.Registry
	ctrl                     *Controller
	cancel                   context.CancelFunc
	done                     chan error
}

const origResolv = "# written by resolvconf\nnameserver 192.0.2.53\nnameserver 192.0.2.54\n"

// newEnv builds the file system: marker dir, resolver file with origResolv
// (mode 0640) unless noResolver, backup/state dir.
func newEnv(t *testing.T, noResolver bool) *env {
	t.Helper()
	d := t.TempDir()
	e := &env{
		t:        t,
		dir:      d,
		marker:   filepath.Join(d, "etc", "inspect-proxmox-egress-lockdown"),
		resolver: filepath.Join(d, "run", "dnsmasq", "resolv.conf"),
		backup:   filepath.Join(d, "run", "pve-inspectd"),
		guard:    &fakeGuard{mgmt: []string{"vmbr0"}},
		halter:   &fakeHalter{},
		reloader: &fakeReloader{},
		reg:      prometheus.NewRegistry(),
	}
	e.state = filepath.Join(e.backup, "lockdown.json")
	for _, p := range []string{filepath.Dir(e.marker), e.backup} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if !noResolver {
		if err := os.MkdirAll(filepath.Dir(e.resolver), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(e.resolver, []byte(origResolv), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(e.resolver, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func (e *env) options() Options {
	m, err := NewMetrics(e.reg)
	if err != nil {
		e.t.Fatal(err)
	}
	return Options{
		Marker: e.marker, Resolver: e.resolver, BackupDir: e.backup, StateFile: e.state,
		Reassert: time.Hour, // the backstop must not hide missed events
		Guard:    e.guard, Halter: e.halter, Reloader: e.reloader, Metrics: m,
	}
}

// start runs the controller until the test ends.
func (e *env) start(opt Options) {
	e.t.Helper()
	c, err := New(opt)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.ctrl, e.cancel, e.done = c, cancel, make(chan error, 1)
	go func() { e.done <- c.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-e.done; err != nil {
			e.t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-c.Synced():
	case <-time.After(15 * time.Second):
		e.t.Fatal("first reconcile never finished")
	}
	if e.ctrl.State().Updated.IsZero() {
		e.t.Fatal("Synced closed before the first state was published")
	}
}

// waitFor polls the published state until cond holds; the deadline only
// turns a hang into a failure.
func (e *env) waitFor(what string, cond func(State) bool) State {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		s := e.ctrl.State()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s; state: %+v", what, s)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func enforced(s State) bool { return s.Marker && s.Enforced && s.Converged }
func lifted(s State) bool   { return !s.Marker && s.Converged }

// checkLifted asserts that nothing of the lockdown is left.
func (e *env) checkLifted(resolverExisted bool) {
	e.t.Helper()
	if lk, fc := e.guard.get(); lk || fc {
		e.t.Errorf("guard lockdown=%v failClosed=%v after lift, want both off", lk, fc)
	}
	if resolverExisted {
		b, err := os.ReadFile(e.resolver)
		if err != nil {
			e.t.Fatalf("resolver after lift: %v", err)
		}
		if !bytes.Equal(b, []byte(origResolv)) {
			e.t.Errorf("resolver after lift = %q, want byte-identical %q", b, origResolv)
		}
		fi, err := os.Stat(e.resolver)
		if err != nil {
			e.t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o640 {
			e.t.Errorf("resolver mode after lift = %v, want 0640", fi.Mode().Perm())
		}
	} else if _, err := os.Lstat(e.resolver); !errors.Is(err, os.ErrNotExist) {
		e.t.Errorf("resolver we created still exists after lift (err %v)", err)
	}
	e.checkNoLeftovers()
}

// checkNoLeftovers asserts that only the state file remains in the backup
// dir and no temporary file in the resolver's and the marker's dirs.
func (e *env) checkNoLeftovers() {
	e.t.Helper()
	ents, _ := os.ReadDir(e.backup)
	for _, de := range ents {
		// The state file (and its temporary while the controller, still
		// running, rewrites it) is the daemon's, not a lockdown leftover.
		if de.Name() != filepath.Base(e.state) && !strings.HasPrefix(de.Name(), "."+filepath.Base(e.state)+".") {
			e.t.Errorf("left behind in backup dir: %s", de.Name())
		}
	}
	for _, dir := range []string{filepath.Dir(e.resolver), filepath.Dir(e.marker)} {
		ents, _ := os.ReadDir(dir)
		for _, de := range ents {
			if strings.Contains(de.Name(), "pve-inspectd") {
				e.t.Errorf("temporary file left behind: %s", filepath.Join(dir, de.Name()))
			}
		}
	}
}

func (e *env) checkEnforced() {
	e.t.Helper()
	if lk, fc := e.guard.get(); !lk || fc {
		e.t.Errorf("guard lockdown=%v failClosed=%v, want lockdown on, blanket drop off", lk, fc)
	}
	b, err := os.ReadFile(e.resolver)
	if err != nil {
		e.t.Fatalf("resolver: %v", err)
	}
	if !bytes.Equal(b, BlankContent(e.marker)) {
		e.t.Errorf("resolver = %q, want the lockdown comment line", b)
	}
	if !bytes.HasPrefix(b, []byte("#")) || bytes.Count(b, []byte("\n")) != 1 {
		e.t.Errorf("blank content %q is not one comment line", b)
	}
}

func TestMarkerTransitions(t *testing.T) {
	// Each case turns the lockdown on and off by a different file
	// operation on the marker.
	type op func(e *env)
	create := func(e *env) {
		if err := os.WriteFile(e.marker, nil, 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
	remove := func(e *env) {
		if err := os.Remove(e.marker); err != nil {
			e.t.Fatal(err)
		}
	}
	renameOver := func(e *env) {
		tmp := filepath.Join(filepath.Dir(e.marker), "marker.tmp")
		if err := os.WriteFile(tmp, []byte("x"), 0o644); err != nil {
			e.t.Fatal(err)
		}
		if err := os.Rename(tmp, e.marker); err != nil {
			e.t.Fatal(err)
		}
	}
	renameAway := func(e *env) {
		if err := os.Rename(e.marker, filepath.Join(e.dir, "marker.old")); err != nil {
			e.t.Fatal(err)
		}
	}
	cli := func(on bool) op {
		return func(e *env) {
			if err := SetMarker(e.marker, on); err != nil {
				e.t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name    string
		on, off op
	}{
		{"create/remove", create, remove},
		{"rename over/rename away", renameOver, renameAway},
		{"SetMarker", cli(true), cli(false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, false)
			e.start(e.options())
			if s := e.ctrl.State(); s.Marker || s.Enforced || !s.Converged {
				t.Fatalf("initial state %+v, want lifted", s)
			}
			tc.on(e)
			s := e.waitFor("enforced", enforced)
			e.checkEnforced()
			if !s.ResolverBlanked || s.Halted != "" || s.FailClosed {
				t.Errorf("state %+v: want resolver blanked, no halt, no blanket drop", s)
			}
			if _, err := os.Stat(filepath.Join(e.backup, backupRecordName)); err != nil {
				t.Errorf("no backup record while locked down: %v", err)
			}
			reloadsOn := e.reloader.count()
			if reloadsOn == 0 {
				t.Error("dnsmasq not reloaded after blanking")
			}
			// The chmod of the marker does not lift anything.
			if err := os.Chmod(e.marker, 0o600); err != nil {
				t.Fatal(err)
			}
			e.ctrl.Kick()
			e.waitFor("enforced after chmod", enforced)

			tc.off(e)
			e.waitFor("lifted", lifted)
			e.checkLifted(true)
			if e.reloader.count() <= reloadsOn {
				t.Error("dnsmasq not reloaded after restore")
			}
			if got := e.halter.got(); len(got) != 0 {
				t.Errorf("halted %v, want no halt", got)
			}
			// The state file says the same as State().
			fs, err := ReadState(e.state)
			if err != nil {
				t.Fatal(err)
			}
			if fs.Marker || !fs.Converged || fs.PID != os.Getpid() {
				t.Errorf("state file %+v, want lifted by this process", fs)
			}
		})
	}
}

func TestResolverRewrittenIsBlankedAgain(t *testing.T) {
	e := newEnv(t, false)
	e.start(e.options())
	if err := SetMarker(e.marker, true); err != nil {
		t.Fatal(err)
	}
	e.waitFor("enforced", enforced)
	reloads := e.reloader.count()

	rewrites := []func() error{
		func() error { return os.WriteFile(e.resolver, []byte("nameserver 198.51.100.1\n"), 0o644) },
		func() error { // resolvconf style: rename a new file over it
			tmp := filepath.Join(filepath.Dir(e.resolver), "new")
			if err := os.WriteFile(tmp, []byte("nameserver 198.51.100.2\n"), 0o644); err != nil {
				return err
			}
			return os.Rename(tmp, e.resolver)
		},
		func() error { return os.Remove(e.resolver) },
	}
	for i, rw := range rewrites {
		if err := rw(); err != nil {
			t.Fatal(err)
		}
		e.waitFor(fmt.Sprintf("re-blanked after rewrite %d", i), func(s State) bool {
			b, _ := os.ReadFile(e.resolver)
			return bytes.Equal(b, BlankContent(e.marker)) && enforced(s) && e.reloader.count() > reloads
		})
		reloads = e.reloader.count()
	}
	if n := testutil.ToFloat64(e.ctrl.opt.Metrics.blanks); n < float64(1+len(rewrites)) {
		t.Errorf("resolver_blanks_total = %v, want >= %d", n, 1+len(rewrites))
	}
	// The backup was taken once: the restore gives the content from before
	// the lockdown, not one of the rewrites.
	if err := SetMarker(e.marker, false); err != nil {
		t.Fatal(err)
	}
	e.waitFor("lifted", lifted)
	e.checkLifted(true)
}

func TestResolverAbsentIsRemovedOnLift(t *testing.T) {
	e := newEnv(t, true) // neither /run/dnsmasq nor the file exist
	e.start(e.options())
	if err := SetMarker(e.marker, true); err != nil {
		t.Fatal(err)
	}
	e.waitFor("enforced", enforced)
	e.checkEnforced()
	// The directory the lockdown created is watched too: a rewrite is
	// undone without waiting for the (hour-long) backstop.
	reloads := e.reloader.count()
	if err := os.WriteFile(e.resolver, []byte("nameserver 198.51.100.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.waitFor("re-blanked", func(s State) bool {
		b, _ := os.ReadFile(e.resolver)
		return enforced(s) && bytes.Equal(b, BlankContent(e.marker)) && e.reloader.count() > reloads
	})
	if err := SetMarker(e.marker, false); err != nil {
		t.Fatal(err)
	}
	e.waitFor("lifted", lifted)
	e.checkLifted(false)
	if _, err := os.Stat(filepath.Dir(e.resolver)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("resolver directory we created is left behind (err %v)", err)
	}
}

func TestNoDefaultRouteFailsClosedAndHalts(t *testing.T) {
	e := newEnv(t, false)
	e.guard.mgmt = nil
	e.start(e.options())
	if err := SetMarker(e.marker, true); err != nil {
		t.Fatal(err)
	}
	s := e.waitFor("halted", func(s State) bool { return s.Marker && s.Halted != "" })
	if s.Enforced || s.Converged || !s.FailClosed {
		t.Errorf("state %+v: want not enforced, blanket drop on", s)
	}
	if _, fc := e.guard.get(); !fc {
		t.Error("blanket forward drop not enabled")
	}
	if got := e.halter.got(); len(got) == 0 || got[0] != ReasonNoDefaultRoute {
		t.Errorf("halt reasons %v, want %q first", got, ReasonNoDefaultRoute)
	}
	if !strings.Contains(s.Reason, "default route") {
		t.Errorf("reason %q does not say why", s.Reason)
	}
	// The resolver is still blanked: fail closed keeps every other part.
	b, _ := os.ReadFile(e.resolver)
	if !bytes.Equal(b, BlankContent(e.marker)) {
		t.Errorf("resolver %q not blanked while failing closed", b)
	}
	if v := testutil.ToFloat64(e.ctrl.opt.Metrics.failClosed); v != 1 {
		t.Errorf("fail_closed metric = %v, want 1", v)
	}
	if v := testutil.ToFloat64(e.ctrl.opt.Metrics.enforced); v != 0 {
		t.Errorf("enforced metric = %v, want 0", v)
	}

	// The default route comes back (guard classification event): the
	// lockdown is enforced again and the blanket drop goes off.
	e.guard.setMgmt("vmbr0")
	e.waitFor("enforced after route returns", enforced)
	e.checkEnforced()
	if n := len(e.halter.got()); n != 1 {
		t.Errorf("%d halts, want exactly 1 for one failure episode", n)
	}
}

func TestNotProvenHalts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  func(e *env)
		reason string
	}{
		{"verify fails", func(e *env) { e.guard.verifyErr = errors.New("rule 7 missing") }, ReasonVerifyFailed},
		{"commit refused", func(e *env) { e.guard.lockdownErr = errors.New("netlink: EPERM") }, ReasonCommitRefused},
		{"blanking fails", func(e *env) {
			// The resolver path is a directory: it cannot be backed up or
			// replaced.
			if err := os.Remove(e.resolver); err != nil {
				e.t.Fatal(err)
			}
			if err := os.Mkdir(e.resolver, 0o755); err != nil {
				e.t.Fatal(err)
			}
		}, ReasonResolverBlank},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, false)
			tc.setup(e)
			e.start(e.options())
			if err := SetMarker(e.marker, true); err != nil {
				t.Fatal(err)
			}
			s := e.waitFor("halted", func(s State) bool { return s.Halted != "" })
			if s.Halted != tc.reason || s.Enforced {
				t.Errorf("state %+v: want halted for %q and not enforced", s, tc.reason)
			}
			if got := e.halter.got(); len(got) == 0 || got[0] != tc.reason {
				t.Errorf("halt reasons %v, want %q", got, tc.reason)
			}
			if v := testutil.ToFloat64(e.ctrl.opt.Metrics.enforced); v != 0 {
				t.Errorf("enforced metric = %v, want 0", v)
			}
		})
	}
}

func TestVerifyRepairedByRecommitDoesNotHalt(t *testing.T) {
	e := newEnv(t, false)
	// Verify fails only while the lockdown rules are not committed: the
	// controller's re-commit repairs it.
	g := &flakyGuard{fakeGuard: e.guard}
	opt := e.options()
	opt.Guard = g
	e.start(opt)
	if err := SetMarker(e.marker, true); err != nil {
		t.Fatal(err)
	}
	e.waitFor("enforced", enforced)
	if got := e.halter.got(); len(got) != 0 {
		t.Errorf("halted %v after a repairable verify failure", got)
	}
	if n := g.verifies.Load(); n < 2 {
		t.Errorf("verify called %d times, want a second verify after the re-commit", n)
	}
}

// flakyGuard fails its first Verify, as if someone deleted a rule between
// the commit and the verify.
type flakyGuard struct {
	*fakeGuard
	verifies atomic.Int32
}

func (g *flakyGuard) Verify(ctx context.Context) error {
	if g.verifies.Add(1) == 1 {
		return errors.New("lockdown rule missing")
	}
	return g.fakeGuard.Verify(ctx)
}

func TestBurstEndsInFinalState(t *testing.T) {
	for _, flips := range []int{200, 201} {
		t.Run(fmt.Sprint(flips), func(t *testing.T) {
			e := newEnv(t, false)
			e.start(e.options())
			for i := range flips {
				if err := SetMarker(e.marker, i%2 == 0); err != nil {
					t.Fatal(err)
				}
			}
			burstEnd := time.Now().UTC()
			finalOn := (flips-1)%2 == 0
			// The marker is now stable: wait for a reconcile that read it
			// after the burst and converged.
			after := func(s State) bool { return s.Updated.After(burstEnd) && s.Converged }
			if finalOn {
				e.waitFor("enforced after the burst", func(s State) bool { return after(s) && enforced(s) })
				e.checkEnforced()
			} else {
				e.waitFor("lifted after the burst", func(s State) bool { return after(s) && lifted(s) })
				e.checkLifted(true)
			}
			if finalOn {
				if err := SetMarker(e.marker, false); err != nil {
					t.Fatal(err)
				}
				e.waitFor("lifted", lifted)
				e.checkLifted(true)
			}
			if got := e.halter.got(); len(got) != 0 {
				t.Errorf("halted %v during a burst", got)
			}
		})
	}
}

func TestStartWithMarkerPresentAndStopKeepsLockdown(t *testing.T) {
	e := newEnv(t, false)
	if err := SetMarker(e.marker, true); err != nil {
		t.Fatal(err)
	}
	c, err := New(e.options())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.ctrl = c
	e.waitFor("enforced at start", enforced)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	// A daemon that stops leaves the lockdown in force.
	e.checkEnforced()
	// No latency was observed: nobody created the marker while we watched.
	if n := histCount(t, e.reg, "pve_inspect_lockdown_marker_to_enforced_seconds"); n != 0 {
		t.Errorf("latency samples = %d for a marker present at start, want 0", n)
	}
	if c.State().LastLatencySeconds != 0 {
		t.Errorf("latency recorded for a marker present at start")
	}

	// A second daemon (restart) lifts it later with the backup the first
	// one took: byte-identical restore across restarts.
	e.reg = prometheus.NewRegistry()
	e.start(e.options())
	e.waitFor("enforced after restart", enforced)
	if err := SetMarker(e.marker, false); err != nil {
		t.Fatal(err)
	}
	e.waitFor("lifted", lifted)
	e.checkLifted(true)
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, false)
	e.start(e.options())
	if err := SetMarker(e.marker, true); err != nil {
		t.Fatal(err)
	}
	s := e.waitFor("enforced", enforced)
	if s.LastLatencySeconds <= 0 {
		t.Errorf("no marker-to-enforced latency in state %+v", s)
	}
	want := `
# HELP pve_inspect_lockdown_enabled 1 when the lockdown marker file is present (or cannot be checked).
# TYPE pve_inspect_lockdown_enabled gauge
pve_inspect_lockdown_enabled 1
# HELP pve_inspect_lockdown_enforced 1 when the lockdown is proven in force: rules committed and verified, resolver blanked, dnsmasq reloaded.
# TYPE pve_inspect_lockdown_enforced gauge
pve_inspect_lockdown_enforced 1
# HELP pve_inspect_lockdown_fail_closed 1 when the blanket forward drop is on (lockdown asked for, no default route).
# TYPE pve_inspect_lockdown_fail_closed gauge
pve_inspect_lockdown_fail_closed 0
# HELP pve_inspect_lockdown_resolver_blanked 1 when the SDN resolver file holds only the lockdown comment line.
# TYPE pve_inspect_lockdown_resolver_blanked gauge
pve_inspect_lockdown_resolver_blanked 1
`
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want),
		"pve_inspect_lockdown_enabled", "pve_inspect_lockdown_enforced",
		"pve_inspect_lockdown_fail_closed", "pve_inspect_lockdown_resolver_blanked"); err != nil {
		t.Error(err)
	}
	if c := histCount(t, e.reg, "pve_inspect_lockdown_marker_to_enforced_seconds"); c != 1 {
		t.Errorf("latency samples = %d, want 1", c)
	}
	if v := testutil.ToFloat64(e.ctrl.opt.Metrics.lastAssert); v < float64(s.LastAssert.Unix()) {
		t.Errorf("last assert = %v, want >= %v", v, s.LastAssert.Unix())
	}
	problems, err := testutil.GatherAndLint(e.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	g, h := &fakeGuard{}, &fakeHalter{}
	for _, tc := range []struct {
		name string
		opt  Options
	}{
		{"no guard", Options{Halter: h}},
		{"no halter", Options{Guard: g}},
		{"relative marker", Options{Guard: g, Halter: h, Marker: "marker"}},
		{"relative resolver", Options{Guard: g, Halter: h, Resolver: "resolv.conf"}},
		{"same file", Options{Guard: g, Halter: h, Marker: "/x/a", Resolver: "/x/a"}},
		{"negative reassert", Options{Guard: g, Halter: h, Reassert: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.opt); err == nil {
				t.Error("New accepted bad options")
			}
		})
	}
}

// histCount returns the sample count of the histogram name in reg.
func histCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestResolverSymlinkRestored(t *testing.T) {
	e := newEnv(t, true)
	if err := os.MkdirAll(filepath.Dir(e.resolver), 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(e.dir, "real-resolv.conf")
	if err := os.WriteFile(target, []byte(origResolv), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, e.resolver); err != nil {
		t.Fatal(err)
	}
	e.start(e.options())
	if err := SetMarker(e.marker, true); err != nil {
		t.Fatal(err)
	}
	e.waitFor("enforced", enforced)
	e.checkEnforced()
	// The link was replaced, not followed: the file it points to is intact.
	if b, _ := os.ReadFile(target); string(b) != origResolv {
		t.Errorf("symlink target changed to %q", b)
	}
	if err := SetMarker(e.marker, false); err != nil {
		t.Fatal(err)
	}
	e.waitFor("lifted", lifted)
	got, err := os.Readlink(e.resolver)
	if err != nil || got != target {
		t.Errorf("resolver after lift: link %q (%v), want a symlink to %q", got, err, target)
	}
	e.checkNoLeftovers()
}

// failingHalter fails its first n halts.
type failingHalter struct {
	fakeHalter
	fail atomic.Int32
}

func (h *failingHalter) Halt(ctx context.Context, reason string) error {
	if h.fail.Add(-1) >= 0 {
		return errors.New("dbus: connection refused")
	}
	return h.fakeHalter.Halt(ctx, reason)
}

func TestHaltRetriedAndReasserted(t *testing.T) {
	e := newEnv(t, false)
	e.guard.verifyErr = errors.New("rule missing")
	h := &failingHalter{}
	h.fail.Store(1)
	opt := e.options()
	opt.Halter = h
	opt.Reassert = 10 * time.Millisecond // the backstop ticks quickly here
	e.start(opt)
	if err := SetMarker(e.marker, true); err != nil {
		t.Fatal(err)
	}
	// The first halt fails and is retried; while the failure lasts every
	// tick asks for the halt again (undoing a premature recover).
	e.waitFor("halted", func(s State) bool { return s.Halted == ReasonVerifyFailed })
	deadline := time.Now().Add(15 * time.Second)
	for len(h.got()) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("halts %v: not re-asserted on ticks", h.got())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, r := range h.got() {
		if r != ReasonVerifyFailed {
			t.Errorf("halt reason %q, want %q", r, ReasonVerifyFailed)
		}
	}
	if s := e.ctrl.State(); s.Enforced || !strings.Contains(s.Reason, "rule missing") {
		t.Errorf("state %+v: want not enforced with the verify error", s)
	}
}

// TestAdoptsReferenceBackup: a node taken over from the reference scripts
// while their lockdown is in force has their blank line in the resolver and
// the original beside it. Our backup must hold that original, so a lift
// restores the real upstream servers, not the reference's blank line.
func TestAdoptsReferenceBackup(t *testing.T) {
	e := newEnv(t, false)
	refBlank := "# inspect-proxmox-egress-lockdown: upstream DNS recursion disabled while marker present\n"
	if err := os.WriteFile(e.resolver+ReferenceBackupSuffix, []byte(origResolv), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.resolver, []byte(refBlank), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := SetMarker(e.marker, true); err != nil {
		t.Fatal(err)
	}
	e.start(e.options())
	e.waitFor("enforced", enforced)
	if b, _ := os.ReadFile(e.resolver); !bytes.Equal(b, BlankContent(e.marker)) {
		t.Fatalf("resolver = %q, want our blank line", b)
	}
	if err := SetMarker(e.marker, false); err != nil {
		t.Fatal(err)
	}
	e.waitFor("lifted", lifted)
	if b, _ := os.ReadFile(e.resolver); string(b) != origResolv {
		t.Fatalf("resolver after lift = %q, want the reference's original %q", b, origResolv)
	}
}
