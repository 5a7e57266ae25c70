package daemon

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mgmtport"
	"github.com/pve-inspect/pve-inspect/sandboxapi/pve"
)

// APIDeps are what the sandbox API needs from the rest of the daemon.
type APIDeps struct {
	// Guests dials guest agents (qgaguest.Dialer(qga.New(...))).
	Guests sandboxapi.GuestDialer
	// Checker runs the containment check; nil answers "unavailable".
	Checker sandboxapi.Checker
	// ZonesChanged receives the sandbox zones and their bridges: pass the
	// host guard's SetZones.
	ZonesChanged func(ctx context.Context, zones map[string][]string) error
	// Iface is the current default-route interface; IfaceChanges delivers
	// new ones (may be nil). They drive the management-port rules.
	Iface        string
	IfaceChanges <-chan string
	// Registerer receives the API metrics.
	Registerer prometheus.Registerer
}

// API is the running sandbox API of `pve-inspectd run`.
type API struct {
	srv      *sandboxapi.Server
	px       *pve.Client
	uln, tln net.Listener
	tcp      http.Handler // the TCP listener's handler (API + /v1/mcp)
	apiPort  int
	cfg      config.APISection
	deps     APIDeps
	log      *slog.Logger
}

// StartAPI connects to Proxmox with the daemon's API token, reconciles
// (re-attaches known sandboxes, deletes tagged orphans) and binds the unix
// socket and, when configured, the TCP+TLS listener. Serve with Run.
func StartAPI(ctx context.Context, cfg config.Config, log *slog.Logger, d APIDeps) (*API, error) {
	a := cfg.API
	secret, err := ReadTokenSecret(a.Proxmox.SecretFile)
	if err != nil {
		return nil, fmt.Errorf("sandbox api: %w", err)
	}
	node := a.Proxmox.Node
	if node == "" {
		node = cfg.Node.ID
	}
	caFile := a.Proxmox.CAFile
	if caFile != "" {
		if _, err := os.Stat(caFile); err != nil {
			return nil, fmt.Errorf("sandbox api: proxmox CA: %w", err)
		}
	}
	px, err := pve.New(pve.Options{URL: a.Proxmox.URL, TokenID: a.Proxmox.TokenID, Secret: secret, Node: node, RootCAFile: caFile})
	if err != nil {
		return nil, fmt.Errorf("sandbox api: %w", err)
	}
	srv, err := sandboxapi.New(sandboxapi.Options{
		Node:      cfg.Node.ID,
		Proxmox:   px,
		Guests:    d.Guests,
		Checker:   d.Checker,
		Tokens:    auth.Open(a.TokenFile),
		QGADir:    a.QGADir,
		Pool:      a.Pool,
		Templates: a.Templates,
		StateDir:  a.StateDir,
		Caps: sandboxapi.Caps{SandboxVCPUs: a.Caps.SandboxVCPUs, SandboxMemoryMiB: a.Caps.SandboxMemoryMiB, SandboxVMs: a.Caps.SandboxVMs,
			NodeVCPUs: a.Caps.NodeVCPUs, NodeMemoryMiB: a.Caps.NodeMemoryMiB, NodeVMs: a.Caps.NodeVMs, NodeSandboxes: a.Caps.NodeSandboxes},
		DefaultTTL:     a.DefaultTTL,
		MaxTTL:         a.MaxTTL,
		ReaperInterval: a.ReaperInterval,
		MaxFileBytes:   a.MaxFileBytes,
		AutoCIDRPool:   netip.MustParsePrefix(a.AutoCIDRPool),
		AutoCIDRBits:   a.AutoCIDRBits,
		AgentTimeout:   a.AgentTimeout,
		ZonesChanged:   d.ZonesChanged,
		Registerer:     d.Registerer,
		Logger:         log,
	})
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	rep, err := srv.Reconcile(rctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("sandbox api: reconcile: %w", err)
	}
	log.Info("sandbox api reconciled", "component", "sandboxapi", "reattached", len(rep.Reattached), "torn_down", len(rep.TornDown),
		"orphan_vms", rep.OrphanVMs, "orphan_zones", rep.OrphanZones)

	mode, _ := a.SocketFileMode()
	api := &API{srv: srv, px: px, cfg: a, deps: d, log: log}
	api.uln, err = sandboxapi.ListenUnix(a.Socket, a.SocketGroup, os.FileMode(mode))
	if err != nil {
		return nil, fmt.Errorf("sandbox api: %w", err)
	}
	if a.Listen != "" {
		if api.tcp, err = TCPHandler(srv, a, cfg.MCP, "", log); err != nil {
			api.uln.Close()
			return nil, fmt.Errorf("sandbox api: %w", err)
		}
		tlsCfg, err := sandboxapi.TLSConfig(a.TLSCert, a.TLSKey)
		if err != nil {
			api.uln.Close()
			return nil, fmt.Errorf("sandbox api: %w", err)
		}
		l, err := net.Listen("tcp", a.Listen)
		if err != nil {
			api.uln.Close()
			return nil, fmt.Errorf("sandbox api: %w", err)
		}
		_, port, _ := net.SplitHostPort(a.Listen)
		api.apiPort, _ = strconv.Atoi(port)
		api.tln = tls.NewListener(l, tlsCfg)
	}
	return api, nil
}

// Server returns the API server (for tests).
func (a *API) Server() *sandboxapi.Server { return a.srv }

// Run serves the API, runs the reaper and the management-port rules
// converger until ctx ends or a listener fails.
func (a *API) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Add(1)
	go func() { defer wg.Done(); errc <- sandboxapi.Serve(ctx, a.uln, a.srv.LocalHandler()) }()
	if a.tln != nil {
		wg.Add(1)
		go func() { defer wg.Done(); errc <- sandboxapi.Serve(ctx, a.tln, a.tcp) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); a.srv.RunReaper(ctx) }()
	if a.cfg.MgmtRules {
		conv := mgmtport.New(a.px, a.apiPort, a.log)
		wg.Add(1)
		go func() { defer wg.Done(); conv.Run(ctx, a.deps.Iface, a.deps.IfaceChanges, a.cfg.MgmtInterval) }()
	}
	var first error
	select {
	case <-ctx.Done():
	case first = <-errc:
	}
	cancel()
	wg.Wait()
	if first != nil && !errors.Is(first, net.ErrClosed) {
		return fmt.Errorf("sandbox api: %w", first)
	}
	return nil
}

// ReadTokenSecret reads a Proxmox API token secret: the plain value, or
// the JSON document `pveum user token add --output-format json` writes
// (packaging/deb/pve-access-setup stores that).
func ReadTokenSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read proxmox token secret: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if strings.HasPrefix(s, "{") {
		var doc struct {
			Value string `json:"value"`
		}
		if err := json.Unmarshal([]byte(s), &doc); err != nil || doc.Value == "" {
			return "", fmt.Errorf("proxmox token secret %s: JSON without a \"value\"", path)
		}
		return doc.Value, nil
	}
	if s == "" {
		return "", fmt.Errorf("proxmox token secret %s is empty", path)
	}
	return s, nil
}
