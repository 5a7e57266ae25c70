package lockdown

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/lockdown"
)

// fakeGuard holds the lockdown and blanket-drop switches the controller
// flips; the probe reads them as a guest would observe the firewall.
type fakeGuard struct {
	mu                   sync.Mutex
	lockdown, failClosed bool
}

func (g *fakeGuard) SetLockdown(_ context.Context, on bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lockdown = on
	return nil
}

func (g *fakeGuard) SetFailClosed(_ context.Context, on bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failClosed = on
	return nil
}

func (g *fakeGuard) Management() []string         { return []string{"vmbr0"} }
func (g *fakeGuard) Verify(context.Context) error { return nil }

// Subscribe: the classification never changes.
func (g *fakeGuard) Subscribe() (<-chan struct{}, func()) { return make(chan struct{}), func() {} }

func (g *fakeGuard) get() (lockdown, failClosed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lockdown, g.failClosed
}

type nopHalter struct{}

func (nopHalter) Halt(context.Context, string) error { return nil }

type nopReloader struct{}

func (nopReloader) Reload(context.Context) (int, error) { return 1, nil }

// env is one controller (and, when asked, the reference timer in front of
// it) on a temporary file system.
type env struct {
	t                        *testing.T
	marker, target, resolver string
	backup, state            string
	guard                    *fakeGuard
	ctrl                     *lockdown.Controller
}

const origResolv = "# written by resolvconf\nnameserver 192.0.2.53\n"

func newEnv(t *testing.T) *env {
	t.Helper()
	d := t.TempDir()
	e := &env{
		t:        t,
		marker:   filepath.Join(d, "etc", "inspect-proxmox-egress-lockdown"),
		resolver: filepath.Join(d, "run", "dnsmasq", "resolv.conf"),
		backup:   filepath.Join(d, "run", "pve-inspectd"),
		guard:    &fakeGuard{},
	}
	e.target, e.state = e.marker, filepath.Join(e.backup, "lockdown.json")
	for _, p := range []string{filepath.Dir(e.marker), filepath.Dir(e.resolver), e.backup} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(e.resolver, []byte(origResolv), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(e.resolver, 0o640); err != nil {
		t.Fatal(err)
	}
	return e
}

// startTimer runs the reference timer in front of the controller (call it
// before start): the controller then watches the timer's target.
func (e *env) startTimer(period time.Duration) {
	e.target = filepath.Join(filepath.Dir(e.marker), "timer", filepath.Base(e.marker))
	if err := os.MkdirAll(filepath.Dir(e.target), 0o755); err != nil {
		e.t.Fatal(err)
	}
	e.goUntilCleanup("timer", Timer{Marker: e.marker, Target: e.target, Period: period}.Run)
}

// start runs the controller until the test ends.
func (e *env) start() {
	e.t.Helper()
	c, err := lockdown.New(lockdown.Options{
		Marker: e.target, Resolver: e.resolver, BackupDir: e.backup, StateFile: e.state,
		Reassert: time.Hour, // the backstop must not hide missed events
		Guard:    e.guard, Halter: nopHalter{}, Reloader: nopReloader{},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.ctrl = c
	e.goUntilCleanup("controller", c.Run)
	select {
	case <-c.Synced():
	case <-time.After(15 * time.Second):
		e.t.Fatal("first reconcile never finished")
	}
}

// goUntilCleanup runs fn until the test ends and fails the test when fn
// returns an error.
func (e *env) goUntilCleanup(what string, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("%s: %v", what, err)
		}
	})
}

// waitLifted polls the published state until the lockdown is lifted; the
// deadline only turns a hang into a failure.
func (e *env) waitLifted() {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		s := e.ctrl.State()
		if !s.Marker && s.Converged {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for the lift; state: %+v", s)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// checkLifted asserts that nothing of the lockdown is left: both switches
// off, the resolver file byte-identical with its mode, only the state file
// in the backup dir, no temporary file beside the resolver or the marker.
func (e *env) checkLifted() {
	e.t.Helper()
	if lk, fc := e.guard.get(); lk || fc {
		e.t.Errorf("guard lockdown=%v failClosed=%v after lift, want both off", lk, fc)
	}
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
	ents, _ := os.ReadDir(e.backup)
	for _, de := range ents {
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
