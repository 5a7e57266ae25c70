package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/firewall"
)

// newNS creates a named network namespace for one test, removed by its
// cleanup.
func newNS(t *testing.T) netns.NsHandle {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root (CI is set, so this is a failure)")
		}
		t.Skip("SKIPPED: needs root for a network namespace and nftables")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	name := "pdn" + hex.EncodeToString(b)
	ns, err := netns.NewNamed(name)
	if err2 := netns.Set(orig); err2 != nil {
		t.Fatalf("back to the original netns: %v", err2)
	}
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		ns.Close()
		_ = netns.DeleteNamed(name)
	})
	return ns
}

// sdRecorder is a Notifier with a watchdog, recording what it is sent.
type sdRecorder struct {
	fakeNotifier
	every time.Duration
}

func (r *sdRecorder) WatchdogInterval() (time.Duration, error) { return r.every, nil }

// TestRunNotifies runs the daemon's guard in a namespace of its own: READY
// comes once the table is verified in force, WATCHDOG pings follow, and
// STOPPING is the last word when the daemon stops.
func TestRunNotifies(t *testing.T) {
	ns := newNS(t)
	cfg := config.Default()
	cfg.Metrics.Listen = ""
	cfg.Guard.StateDir = t.TempDir()
	// The lockdown works on files of the test's own (no marker: lifted).
	dir := t.TempDir()
	cfg.Lockdown.Marker = filepath.Join(dir, "marker")
	cfg.Lockdown.Resolver = filepath.Join(dir, "resolv.conf")
	cfg.Lockdown.BackupDir = dir
	cfg.Lockdown.StateFile = filepath.Join(dir, "lockdown.json")
	cfg.Halt.StateFile = filepath.Join(dir, "halted")
	cfg.Halt.Units = []string{"pve-inspectd-test-none.service"}
	n := &sdRecorder{fakeNotifier: fakeNotifier{pings: make(chan struct{}, 1)}, every: 200 * time.Millisecond}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	readyInForce := make(chan error, 1)
	d := &Daemon{
		Config:       cfg,
		GuardOptions: []firewall.Option{firewall.WithNetNS(ns)},
		Notify:       n,
		Ready: func() {
			// Called just before READY=1: the table must be in force now.
			st, err := firewall.Inspect(ctx, GuardConfig(cfg.Guard), firewall.WithNetNS(ns))
			if err == nil && (!st.Present || len(st.Drifts) > 0) {
				err = &firewall.DriftError{Drifts: st.Drifts}
			}
			if err == nil && len(n.states()) != 0 {
				err = os.ErrExist
			}
			readyInForce <- err
		},
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	select {
	case err := <-readyInForce:
		if err != nil {
			t.Fatalf("at readiness: %v (states so far %q)", err, n.states())
		}
	case err := <-done:
		t.Fatalf("Run ended before ready: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("no readiness")
	}
	for i := 0; i < 2; i++ {
		select {
		case <-n.pings:
		case <-time.After(time.Minute):
			t.Fatalf("no watchdog ping; sent %q", n.states())
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not stop")
	}
	st := n.states()
	if len(st) < 4 || !strings.HasPrefix(st[0], "READY=1\n") || !strings.HasPrefix(st[len(st)-1], "STOPPING=1\n") {
		t.Fatalf("states %q: want READY first, pings, STOPPING last", st)
	}
	for _, s := range st[1 : len(st)-1] {
		if s != "WATCHDOG=1" {
			t.Fatalf("between READY and STOPPING: %q", s)
		}
	}
}
