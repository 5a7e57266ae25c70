package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pve-inspect/pve-inspect/firewall/mgmtport"
)

// movingMgmt is a Management whose interface the test moves.
type movingMgmt struct {
	mu    sync.Mutex
	iface string
	sub   chan struct{}
}

func (m *movingMgmt) Management() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return []string{m.iface}
}

func (m *movingMgmt) Subscribe() (<-chan struct{}, func()) { return m.sub, func() {} }

func (m *movingMgmt) move(iface string) {
	m.mu.Lock()
	m.iface = iface
	m.mu.Unlock()
	m.sub <- struct{}{}
}

// TestMgmtRulesWithoutAPI runs the management-port rules part with the
// sandbox API off, against the Proxmox emulator: without the daemon's
// token it reports no_token and does not end; once the token exists the
// rules converge (no restart), and they follow the default route.
func TestMgmtRulesWithoutAPI(t *testing.T) {
	bed := newPVEBed(t)
	bed.up(t)
	dir := t.TempDir()
	cfg := bed.config(t, dir)
	cfg.API.Enabled = false
	secret, err := os.ReadFile(cfg.API.Proxmox.SecretFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(cfg.API.Proxmox.SecretFile); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&logs, &logMu}, nil))
	reg := prometheus.NewPedanticRegistry()
	mg := &movingMgmt{iface: "mgmt0", sub: make(chan struct{}, 1)}
	m, err := newMgmtRules(log, reg, mg, func() (mgmtport.Firewall, error) { return ProxmoxClient(cfg) },
		func(fw mgmtport.Firewall) *mgmtport.Converger { return mgmtConverger(fw, cfg, log) }, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.run(ctx) }()

	state := func(s string) float64 { return testutil.ToFloat64(m.state.WithLabelValues(s)) }
	waitFor(t, "no_token state", func() error {
		if state(mgmtNoToken) != 1 || testutil.ToFloat64(m.rounds.WithLabelValues(mgmtNoToken)) < 2 {
			return fmt.Errorf("state %v/%v/%v", state(mgmtConverged), state(mgmtFailed), state(mgmtNoToken))
		}
		return nil
	})
	logMu.Lock()
	skipped := strings.Count(logs.String(), "management-port rules SKIPPED")
	logMu.Unlock()
	if skipped != 1 {
		t.Errorf("%d skip lines after several rounds, want exactly one:\n%s", skipped, logs.String())
	}
	if n := bed.nodeRules(); n != 0 {
		t.Fatalf("%d node rules without a token", n)
	}
	select {
	case err := <-done:
		t.Fatalf("part ended without a token: %v", err)
	default:
	}

	if err := os.WriteFile(cfg.API.Proxmox.SecretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "rules once the token exists", func() error {
		// in: 8006, 22, dns udp/tcp, dhcp; out: the replies of every port
		// the guard notracks: 8006, 22 and the metrics listener's 9474
		if n := bed.nodeRules(); n != 8 || state(mgmtConverged) != 1 {
			return fmt.Errorf("%d node rules (want 8), converged %v", n, state(mgmtConverged))
		}
		return nil
	})
	mg.move("eth9")
	waitFor(t, "rules follow the default route", func() error {
		if !strings.Contains(bed.nodeRuleIfaces(), "eth9") || strings.Contains(bed.nodeRuleIfaces(), "mgmt0") {
			return fmt.Errorf("rule interfaces %q", bed.nodeRuleIfaces())
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
