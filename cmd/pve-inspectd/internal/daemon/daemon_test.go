package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// testParts points the guard, lockdown and halt of cfg at files of the
// test's own (no marker: the lockdown is lifted) and turns metrics off.
func testParts(t *testing.T, cfg *config.Config) {
	cfg.Metrics.Listen = ""
	cfg.Guard.StateDir = t.TempDir()
	dir := t.TempDir()
	cfg.Lockdown.Marker = filepath.Join(dir, "marker")
	cfg.Lockdown.Resolver = filepath.Join(dir, "resolv.conf")
	cfg.Lockdown.BackupDir = dir
	cfg.Lockdown.StateFile = filepath.Join(dir, "lockdown.json")
	cfg.Halt.StateFile = filepath.Join(dir, "halted")
	cfg.Halt.Units = []string{"pve-inspectd-test-none.service"}
	cfg.Egress.StateFile = filepath.Join(dir, "egress.json")
	cfg.API.StateDir = filepath.Join(dir, "api")
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
	ns := testkit.NewNetNS(t, "pdn").Handle()
	cfg := config.Default()
	testParts(t, &cfg)
	n := &sdRecorder{fakeNotifier: fakeNotifier{pings: make(chan struct{}, 1)}, every: 200 * time.Millisecond}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	readyInForce := make(chan error, 1)
	d := &Daemon{
		Config:       cfg,
		GuardOptions: []firewall.Option{firewall.WithNetNS(ns)},
		EgressNS:     &ns,
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

// TestRunProxmoxDownAtStart runs the whole daemon while nothing listens at
// the Proxmox address: READY comes with the guard's table in force and the
// lockdown reconciled, the API answers 503 `unavailable`, and once Proxmox
// comes up the API answers healthy without a restart.
func TestRunProxmoxDownAtStart(t *testing.T) {
	ns := testkit.NewNetNS(t, "pdn").Handle()
	bed := newPVEBed(t)
	cfg := bed.config(t, t.TempDir())
	testParts(t, &cfg)
	cfg.Guard.MgmtRules = false
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	atReady := make(chan error, 1)
	var api *API
	d := &Daemon{
		Config:       cfg,
		GuardOptions: []firewall.Option{firewall.WithNetNS(ns)},
		EgressNS:     &ns,
		APIRetry:     50 * time.Millisecond,
		API:          func(a *API) { api = a },
		Ready: func() {
			st, err := firewall.Inspect(ctx, GuardConfig(cfg.Guard), firewall.WithNetNS(ns))
			if err == nil && (!st.Present || len(st.Drifts) > 0) {
				err = &firewall.DriftError{Drifts: st.Drifts}
			}
			if err == nil {
				_, err = os.Stat(cfg.Lockdown.StateFile) // the lockdown published its first state
			}
			atReady <- err
		},
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	select {
	case err := <-atReady:
		if err != nil {
			t.Fatalf("at readiness: %v", err)
		}
	case err := <-done:
		t.Fatalf("Run ended before ready: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("no readiness while proxmox is down")
	}
	c := client.NewUnix(cfg.API.Socket)
	waitFor(t, "503 while proxmox is down", func() error {
		_, err := c.Health(ctx)
		if client.IsProblem(err, apitype.ProblemUnavailable) {
			return nil
		}
		return fmt.Errorf("want unavailable, got %v", err)
	})
	if api.Server() != nil {
		t.Fatal("API reports reconciled while proxmox is down")
	}
	bed.up(t)
	waitFor(t, "healthy once proxmox is up", func() error {
		_, err := c.Health(ctx)
		return err
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not stop")
	}
}
