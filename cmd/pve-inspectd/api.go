package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
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

// apiDeps are the parts of the sandbox API the daemon's run verb supplies:
// the guest agent client and the containment probe (through adapters) and
// the default-route interface.
//
//lint:ignore U1000 used by runAPI, which the daemon's run verb calls once it lands
type apiDeps struct {
	Guests  sandboxapi.GuestDialer
	Checker sandboxapi.Checker // nil: check answers "unavailable"
	// Iface is the current default-route interface; IfaceChanges delivers
	// new ones (may be nil).
	Iface        string
	IfaceChanges <-chan string
	Registerer   prometheus.Registerer
	// ZonesChanged receives the sandbox zones and their bridges (pass
	// the host guard's SetZones).
	ZonesChanged func(ctx context.Context, zones map[string][]string) error
}

// runAPI serves the sandbox API until ctx ends: it reconciles, listens on
// the unix socket (and TCP+TLS when configured), runs the reaper and the
// management-port rules converger.
//
//lint:ignore U1000 called by the daemon's run verb (wired by the integrator)
func runAPI(ctx context.Context, cfg config.Config, log *slog.Logger, d apiDeps) error {
	a := cfg.API
	secret, err := readTokenSecret(a.Proxmox.SecretFile)
	if err != nil {
		return fmt.Errorf("sandbox api: %w", err)
	}
	node := a.Proxmox.Node
	if node == "" {
		node = cfg.Node.ID
	}
	caFile := a.Proxmox.CAFile
	if _, err := os.Stat(caFile); caFile != "" && err != nil {
		return fmt.Errorf("sandbox api: proxmox CA: %w", err)
	}
	px, err := pve.New(pve.Options{URL: a.Proxmox.URL, TokenID: a.Proxmox.TokenID, Secret: secret, Node: node, RootCAFile: caFile})
	if err != nil {
		return fmt.Errorf("sandbox api: %w", err)
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
		Registerer:     d.Registerer,
		ZonesChanged:   d.ZonesChanged,
		Logger:         log,
	})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	rep, err := srv.Reconcile(rctx)
	cancel()
	if err != nil {
		return fmt.Errorf("sandbox api: reconcile: %w", err)
	}
	log.Info("sandbox api reconciled", "reattached", len(rep.Reattached), "torn_down", len(rep.TornDown),
		"orphan_vms", rep.OrphanVMs, "orphan_zones", rep.OrphanZones)

	mode, _ := a.SocketFileMode()
	uln, err := sandboxapi.ListenUnix(a.Socket, a.SocketGroup, os.FileMode(mode))
	if err != nil {
		return fmt.Errorf("sandbox api: %w", err)
	}
	var tln net.Listener
	apiPort := 0
	if a.Listen != "" {
		tlsCfg, err := sandboxapi.TLSConfig(a.TLSCert, a.TLSKey)
		if err != nil {
			uln.Close()
			return fmt.Errorf("sandbox api: %w", err)
		}
		l, err := net.Listen("tcp", a.Listen)
		if err != nil {
			uln.Close()
			return fmt.Errorf("sandbox api: %w", err)
		}
		_, port, _ := net.SplitHostPort(a.Listen)
		apiPort, _ = strconv.Atoi(port)
		tln = tls.NewListener(l, tlsCfg)
	}

	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Add(1)
	go func() { defer wg.Done(); errc <- sandboxapi.Serve(ctx, uln, srv.LocalHandler()) }()
	if tln != nil {
		wg.Add(1)
		go func() { defer wg.Done(); errc <- sandboxapi.Serve(ctx, tln, srv.Handler()) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); srv.RunReaper(ctx) }()
	if a.MgmtRules {
		conv := mgmtport.New(px, apiPort, log)
		wg.Add(1)
		go func() { defer wg.Done(); conv.Run(ctx, d.Iface, d.IfaceChanges, a.MgmtInterval) }()
	}
	var first error
	select {
	case <-ctx.Done():
	case first = <-errc:
	}
	wg.Wait()
	if first != nil && !errors.Is(first, net.ErrClosed) {
		return fmt.Errorf("sandbox api: %w", first)
	}
	return nil
}

// readTokenSecret reads a Proxmox API token secret: the plain value, or
// the JSON document `pveum user token add --output-format json` writes
// (packaging/deb/pve-access-setup stores that).
func readTokenSecret(path string) (string, error) {
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
