package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/daemon"
	"github.com/pve-inspect/pve-inspect/lockdown"
	"github.com/pve-inspect/pve-inspect/lockdown/halt"
)

// cliGuard is a stand-in host guard for the CLI tests.
type cliGuard struct {
	mu        sync.Mutex
	on        bool
	verifyErr error
}

func (g *cliGuard) SetLockdown(_ context.Context, on bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.on = on
	return nil
}
func (g *cliGuard) SetFailClosed(context.Context, bool) error { return nil }
func (g *cliGuard) Management() []string                      { return []string{"vmbr0"} }
func (g *cliGuard) Verify(context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.verifyErr
}
func (g *cliGuard) Subscribe() (<-chan struct{}, func()) { return make(chan struct{}), func() {} }

type cliHalter struct{}

func (cliHalter) Halt(context.Context, string) error { return nil }

type noReload struct{}

func (noReload) Reload(context.Context) (int, error) { return 0, nil }

// cliEnv writes a config naming temporary paths and can run a controller
// on them.
type cliEnv struct {
	t    *testing.T
	conf string
	sec  config.LockdownSection
}

func newCLIEnv(t *testing.T) *cliEnv {
	d := t.TempDir()
	e := &cliEnv{t: t, conf: filepath.Join(d, "config.toml")}
	doc := fmt.Sprintf(`[node]
id = "test"
[lockdown]
marker = %q
resolver = %q
backup_dir = %q
state_file = %q
reassert_interval = "1s"
`, filepath.Join(d, "marker"), filepath.Join(d, "resolv.conf"), filepath.Join(d, "run"), filepath.Join(d, "run", "lockdown.json"))
	if err := os.WriteFile(e.conf, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "resolv.conf"), []byte("nameserver 192.0.2.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(e.conf, false)
	if err != nil {
		t.Fatal(err)
	}
	e.sec = cfg.Lockdown.Effective()
	return e
}

// daemon runs a controller on the env's paths until the test ends.
func (e *cliEnv) daemon(g *cliGuard) {
	opt := daemon.LockdownOptions(e.sec)
	opt.Guard, opt.Halter, opt.Reloader = g, cliHalter{}, noReload{}
	c, err := lockdown.New(opt)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); <-done })
}

// run executes the CLI and returns its output and exit code.
func (e *cliEnv) run(args ...string) (string, int) {
	e.t.Helper()
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"-c", e.conf}, args...))
	err := cmd.ExecuteContext(context.Background())
	var ee *exitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &ee):
		return out.String() + ee.msg, ee.code
	default:
		return out.String() + err.Error(), 1
	}
}

func TestLockdownCLI(t *testing.T) {
	e := newCLIEnv(t)
	if out, code := e.run("lockdown", "status"); code != exitNotConverged || !strings.Contains(out, "no lockdown state") {
		t.Errorf("status without a daemon: code %d, output:\n%s", code, out)
	}
	g := &cliGuard{}
	e.daemon(g)

	out, code := e.run("lockdown", "on", "--wait", "20s")
	if code != 0 || !strings.Contains(out, "lockdown in force") {
		t.Fatalf("on --wait: code %d, output:\n%s", code, out)
	}
	if _, err := os.Stat(e.sec.Marker); err != nil {
		t.Errorf("marker not created: %v", err)
	}
	out, code = e.run("lockdown", "status")
	if code != 0 || !strings.Contains(out, "enforced:         yes") || !strings.Contains(out, "resolver blanked: yes") {
		t.Errorf("status while enforced: code %d, output:\n%s", code, out)
	}
	out, code = e.run("lockdown", "on") // again: idempotent
	if code != 0 {
		t.Errorf("second on: code %d, output:\n%s", code, out)
	}

	out, code = e.run("lockdown", "off", "--wait", "20s")
	if code != 0 || !strings.Contains(out, "lockdown lifted") {
		t.Fatalf("off --wait: code %d, output:\n%s", code, out)
	}
	out, code = e.run("lockdown", "status", "--json")
	if code != 0 || !strings.Contains(out, `"marker": false`) || !strings.Contains(out, `"ok": true`) {
		t.Errorf("status --json after off: code %d, output:\n%s", code, out)
	}

	// The lockdown cannot be proven: on --wait fails with the reason, and
	// status says why with exit code 3.
	g.mu.Lock()
	g.verifyErr = errors.New("table pve-inspect is missing")
	g.mu.Unlock()
	out, code = e.run("lockdown", "on", "--wait", "2s")
	if code != exitNotConverged || !strings.Contains(out, "verify") {
		t.Errorf("on --wait with a failing verify: code %d, output:\n%s", code, out)
	}
	out, code = e.run("lockdown", "status")
	if code != exitNotConverged || !strings.Contains(out, "table pve-inspect is missing") || !strings.Contains(out, "enforced:         no") {
		t.Errorf("status with a failing verify: code %d, output:\n%s", code, out)
	}
}

func TestLockdownStatusDeadDaemon(t *testing.T) {
	e := newCLIEnv(t)
	// A state file left by a daemon that is gone: pid beyond pid_max.
	st := lockdown.State{Marker: false, Converged: true, PID: 1 << 30, Updated: time.Now().UTC()}
	if err := lockdown.WriteState(e.sec.StateFile, st); err != nil {
		t.Fatal(err)
	}
	out, code := e.run("lockdown", "status")
	if code != exitNotConverged || !strings.Contains(out, "not running") {
		t.Errorf("status with a dead daemon: code %d, output:\n%s", code, out)
	}
	// Alive but stale.
	st.PID = os.Getpid()
	st.Updated = time.Now().Add(-time.Hour)
	if err := lockdown.WriteState(e.sec.StateFile, st); err != nil {
		t.Fatal(err)
	}
	out, code = e.run("lockdown", "status")
	if code != exitNotConverged || !strings.Contains(out, "stale") {
		t.Errorf("status with a stale state: code %d, output:\n%s", code, out)
	}
	// Marker present but the daemon's state still says absent.
	st.Updated = time.Now().UTC()
	if err := lockdown.WriteState(e.sec.StateFile, st); err != nil {
		t.Fatal(err)
	}
	if err := lockdown.SetMarker(e.sec.Marker, true); err != nil {
		t.Fatal(err)
	}
	out, code = e.run("lockdown", "status")
	if code != exitNotConverged || !strings.Contains(out, "not acted on the marker") {
		t.Errorf("status before the daemon acted: code %d, output:\n%s", code, out)
	}
}

func TestLockdownCause(t *testing.T) {
	e := newCLIEnv(t)
	cfg, err := config.Load(e.conf, false)
	if err != nil {
		t.Fatal(err)
	}
	check := lockdownCause(cfg)
	if err := check(context.Background(), halt.State{}); err != nil {
		t.Errorf("marker absent: cause %v, want none", err)
	}
	if err := lockdown.SetMarker(e.sec.Marker, true); err != nil {
		t.Fatal(err)
	}
	// Marker present and no daemon state: the lockdown is not proven (or,
	// on a host without a default route, the route cause persists).
	if err := check(context.Background(), halt.State{}); err == nil {
		t.Error("marker present without a daemon: no cause reported")
	}
	// A daemon that reports the lockdown enforced lifts the cause, unless
	// this host has no default route.
	st := lockdown.State{Marker: true, Enforced: true, Converged: true, PID: os.Getpid(), Updated: time.Now().UTC()}
	if err := lockdown.WriteState(e.sec.StateFile, st); err != nil {
		t.Fatal(err)
	}
	err = check(context.Background(), halt.State{})
	if err != nil && !strings.Contains(err.Error(), "default route") {
		t.Errorf("lockdown enforced: cause %v", err)
	}
}

// TestLockdownSync is the reference runbook's unit: the marker is created
// or removed by hand ("touch", "rm"), then `lockdown sync` waits until the
// daemon has the node in that state, and fails (exit 3) when it cannot.
func TestLockdownSync(t *testing.T) {
	e := newCLIEnv(t)
	if out, code := e.run("lockdown", "sync", "--wait", "300ms"); code != exitNotConverged {
		t.Errorf("sync without a daemon: code %d, output:\n%s", code, out)
	}
	g := &cliGuard{}
	e.daemon(g)
	steps := []struct {
		name   string
		marker bool
		verify error
		code   int
		want   string
	}{
		{name: "touch, then sync", marker: true, code: 0, want: "lockdown in force"},
		{name: "rm, then sync", marker: false, code: 0, want: "lockdown lifted"},
		{name: "touch, lockdown cannot be proven", marker: true, verify: errors.New("table pve-inspect is missing"), code: exitNotConverged, want: "not converged"},
	}
	for _, s := range steps {
		g.mu.Lock()
		g.verifyErr = s.verify
		g.mu.Unlock()
		if s.marker {
			if err := os.WriteFile(e.sec.Marker, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		} else if err := os.Remove(e.sec.Marker); err != nil {
			t.Fatal(err)
		}
		wait := "20s"
		if s.code != 0 {
			wait = "2s"
		}
		out, code := e.run("lockdown", "sync", "--wait", wait)
		if code != s.code || !strings.Contains(out, s.want) {
			t.Errorf("%s: code %d, output:\n%s", s.name, code, out)
		}
	}
}
