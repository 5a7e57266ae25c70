package scale

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/sdnzones"
)

// stack is the guard wired as the daemon wires it (cmd/pve-inspectd's
// startGuard and startZones): the zones of the SDN running config and of
// the sandbox API joined into SetZones, the running config reread at
// every interface change the guard reports, the port map set again every
// portmapEvery.
type stack struct {
	g       *firewall.Guard
	w       *sdnzones.Watcher
	cfgPath string

	mu    sync.Mutex // guards bySrc, ports, sdn and serializes SetZones
	bySrc map[string]map[string][]string
	ports []firewall.Port
	sdn   map[string]string // vnet -> zone of the running config
	ver   int

	stop func()
}

// portmapEvery is firewall/portmap's DefaultInterval.
const portmapEvery = 2 * time.Second

func (s *stack) setZones(src string) func(context.Context, map[string][]string) error {
	return func(ctx context.Context, z map[string][]string) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.bySrc[src] = z
		all := make([]map[string][]string, 0, len(s.bySrc))
		for _, k := range slices.Sorted(maps.Keys(s.bySrc)) {
			all = append(all, s.bySrc[k])
		}
		return s.g.SetZones(ctx, sdnzones.Union(all...))
	}
}

// writeRunningConfig writes the SDN running config (atomically, as
// pmxcfs shows a finished write) with one simple zone per vnet.
func (s *stack) writeRunningConfig() error {
	s.mu.Lock()
	s.ver++
	var zones, vnets []string
	seen := map[string]bool{}
	for _, v := range slices.Sorted(maps.Keys(s.sdn)) {
		z := s.sdn[v]
		if !seen[z] {
			seen[z] = true
			zones = append(zones, fmt.Sprintf(`%q:{"type":"simple","dhcp":"dnsmasq","ipam":"pve"}`, z))
		}
		vnets = append(vnets, fmt.Sprintf(`%q:{"type":"vnet","zone":%q}`, v, z))
	}
	doc := fmt.Sprintf(`{"version":%d,"zones":{"ids":{%s}},"vnets":{"ids":{%s}},"subnets":{"ids":{}},"controllers":{"ids":{}}}`,
		s.ver, strings.Join(zones, ","), strings.Join(vnets, ","))
	s.mu.Unlock()
	tmp := s.cfgPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, s.cfgPath)
}

// addSDN adds vnets (each its own zone, named after it) to the running
// config and writes it.
func (s *stack) addSDN(vnets ...string) error {
	s.mu.Lock()
	for _, v := range vnets {
		s.sdn[v] = "z" + v[1:]
	}
	s.mu.Unlock()
	return s.writeRunningConfig()
}

// start brings the guard up as the daemon does and returns when it is in
// force with the running config's zones (ready).
func startStack(ctx context.Context, n *node, dir string, sdn map[string]string, ports []firewall.Port, log *slog.Logger) (*stack, error) {
	s := &stack{cfgPath: filepath.Join(dir, "running-config"), bySrc: map[string]map[string][]string{}, sdn: sdn, ports: ports}
	if err := s.writeRunningConfig(); err != nil {
		return nil, err
	}
	g, err := firewall.New(firewall.Config{DnsmasqUser: "65534", ProcRoot: filepath.Join(dir, "proc"), StateDir: filepath.Join(dir, "state")},
		firewall.WithNetNS(n.ns), firewall.WithLogger(log))
	if err != nil {
		return nil, err
	}
	s.g = g
	if err := g.SetPorts(ctx, ports); err != nil {
		g.Close()
		return nil, err
	}
	if err := g.Start(ctx); err != nil {
		g.Close()
		return nil, err
	}
	s.w, err = sdnzones.New(sdnzones.Options{Path: s.cfgPath, Apply: s.setZones("sdn"), Logger: log})
	if err == nil {
		err = s.w.Sync(ctx)
	}
	if err != nil {
		g.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	sub, unsub := g.Subscribe()
	wg.Add(4)
	go func() { defer wg.Done(); _ = g.Run(rctx) }()
	go func() { defer wg.Done(); _ = s.w.Run(rctx) }()
	go func() { // the daemon's kick of the watcher on interface changes
		defer wg.Done()
		for {
			select {
			case <-rctx.Done():
				return
			case <-sub:
				s.w.Kick()
			}
		}
	}()
	go func() { // the port mapper's loop
		defer wg.Done()
		t := time.NewTicker(portmapEvery)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-t.C:
				s.mu.Lock()
				p := s.ports
				s.mu.Unlock()
				_ = g.SetPorts(rctx, p)
			}
		}
	}()
	s.stop = func() { cancel(); wg.Wait(); unsub(); g.Close() }
	return s, nil
}
