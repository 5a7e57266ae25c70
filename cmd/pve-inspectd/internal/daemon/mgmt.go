package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/firewall/mgmtport"
)

// Management-port rule states, the values of pve_inspect_mgmt_rules_state.
const (
	mgmtConverged = "converged" // rules and firewall switches as desired
	mgmtFailed    = "failed"    // Proxmox refused or could not be reached; retried
	mgmtNoToken   = "no_token"  // no readable daemon token: skipped, retried
)

var mgmtStates = []string{mgmtConverged, mgmtFailed, mgmtNoToken}

// mgmtRules keeps the Proxmox management-port rules (DESIGN.md section 3)
// converged: a part of the guard, with or without the sandbox API. It
// talks to Proxmox with the daemon's token; without one it skips, says so
// once in the log and in its metric, and tries again every interval, so a
// token created later is picked up without a restart. It never fails the
// daemon.
type mgmtRules struct {
	log     *slog.Logger
	mgmt    Management
	connect func() (mgmtport.Firewall, error) // *NoTokenError when there is no token
	// converger builds the converger once connected (mgmtConverger)
	converger func(mgmtport.Firewall) *mgmtport.Converger
	interval  time.Duration
	state     *prometheus.GaugeVec
	rounds    *prometheus.CounterVec
}

// startMgmtRules starts the management-port rules part unless
// [guard] mgmt_rules is off. It converges in the background: Proxmox may
// come up after the daemon.
func (r *run) startMgmtRules(context.Context) error {
	cfg := r.d.Config
	if !cfg.Guard.MgmtRules {
		r.log.Info("management-port rules: off (guard.mgmt_rules = false)", "component", "mgmtport")
		return nil
	}
	m, err := newMgmtRules(r.log, r.reg, r.guard, func() (mgmtport.Firewall, error) { return ProxmoxClient(cfg) },
		func(fw mgmtport.Firewall) *mgmtport.Converger { return mgmtConverger(fw, cfg, r.log) }, cfg.Guard.MgmtEvery())
	if err != nil {
		return err
	}
	r.parts.Go("management rules", m.run)
	return nil
}

// mgmtConverger is cfg's converger: the rules of the sandbox API port,
// and a node OUT rule for the replies of every port the guard takes out
// of connection tracking ([guard] management_ports, with the daemon's
// listeners), so a host firewall's policy_out DROP cannot take them.
func mgmtConverger(fw mgmtport.Firewall, cfg config.Config, log *slog.Logger) *mgmtport.Converger {
	return mgmtport.New(fw, sandboxAPIPort(cfg), log, cfg.Guard.ManagementPorts...)
}

func newMgmtRules(log *slog.Logger, reg prometheus.Registerer, mgmt Management, connect func() (mgmtport.Firewall, error),
	converger func(mgmtport.Firewall) *mgmtport.Converger, interval time.Duration) (*mgmtRules, error) {
	if interval <= 0 {
		interval = time.Minute
	}
	m := &mgmtRules{log: log.With("component", "mgmtport"), mgmt: mgmt, connect: connect, converger: converger, interval: interval,
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pve_inspect_mgmt_rules_state",
			Help: "1 for the current state of the Proxmox management-port rules: converged, failed (retried), no_token (skipped until the daemon's Proxmox token exists)."},
			[]string{"state"}),
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pve_inspect_mgmt_rules_rounds_total",
			Help: "Convergence rounds of the Proxmox management-port rules by state reached."}, []string{"state"}),
	}
	for _, c := range []prometheus.Collector{m.state, m.rounds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("management rules: register metrics: %w", err)
		}
	}
	for _, s := range mgmtStates {
		m.state.WithLabelValues(s)
		m.rounds.WithLabelValues(s)
	}
	return m, nil
}

// run converges now, whenever the default-route interface changes, and
// every interval, until ctx ends; it returns nil then.
func (m *mgmtRules) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	ifaces := make(chan string, 1)
	wg.Add(1)
	go func() { defer wg.Done(); forwardManagement(ctx, m.mgmt, ifaces) }()

	iface := firstIface(m.mgmt.Management())
	var conv *mgmtport.Converger
	lastState, lastErr := "", ""
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		state, err := m.round(ctx, &conv, iface)
		if ctx.Err() != nil {
			return nil
		}
		m.record(state)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if state != lastState || msg != lastErr { // one line per change, not per round
			m.report(state, iface, err)
			lastState, lastErr = state, msg
		}
		select {
		case <-ctx.Done():
			return nil
		case iface = <-ifaces:
		case <-t.C:
		}
	}
}

// round connects when not connected yet and converges once.
func (m *mgmtRules) round(ctx context.Context, conv **mgmtport.Converger, iface string) (string, error) {
	if *conv == nil {
		fw, err := m.connect()
		var nt *NoTokenError
		if errors.As(err, &nt) {
			return mgmtNoToken, err
		}
		if err != nil {
			return mgmtFailed, err
		}
		*conv = m.converger(fw)
	}
	cctx, cancel := context.WithTimeout(ctx, m.interval)
	defer cancel()
	if _, err := (*conv).Converge(cctx, iface); err != nil {
		return mgmtFailed, err
	}
	return mgmtConverged, nil
}

func (m *mgmtRules) record(state string) {
	for _, s := range mgmtStates {
		v := 0.0
		if s == state {
			v = 1
		}
		m.state.WithLabelValues(s).Set(v)
	}
	m.rounds.WithLabelValues(state).Inc()
}

func (m *mgmtRules) report(state, iface string, err error) {
	switch state {
	case mgmtConverged:
		m.log.Info("management-port rules converged", "iface", iface)
	case mgmtNoToken:
		m.log.Warn("management-port rules SKIPPED: no Proxmox API token for the daemon; "+
			"create it (packaging/deb/pve-access-setup) and the rules follow within mgmt_interval", "err", err, "retry_every", m.interval)
	default:
		m.log.Error("management-port rules not converged; retrying", "iface", iface, "err", err, "retry_every", m.interval)
	}
}

// sandboxAPIPort is the TCP port of the sandbox API when it listens on
// TCP (0: no rule for it).
func sandboxAPIPort(cfg config.Config) int {
	if !cfg.API.Enabled || cfg.API.Listen == "" {
		return 0
	}
	_, port, _ := net.SplitHostPort(cfg.API.Listen)
	n, _ := strconv.Atoi(port)
	return n
}
