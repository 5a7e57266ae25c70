package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/firewall/sdnzones"
)

// zoneUnion merges the run-time zones of several sources (the sandbox
// API, Proxmox's SDN running config) into the one map the guard takes.
// Zones with the same id from two sources are one Proxmox zone: their
// vnets are joined.
type zoneUnion struct {
	set func(context.Context, map[string][]string) error
	// gone, when set, hears of the zones a successful set dropped (the
	// egress part forgets what it kept of them); called in order, under
	// mu, so it must not call back into the union.
	gone func(zones []string)

	mu    sync.Mutex // guards bySrc and serializes calls of set
	bySrc map[string]map[string][]string
}

func newZoneUnion(set func(context.Context, map[string][]string) error, gone func([]string)) *zoneUnion {
	return &zoneUnion{set: set, gone: gone, bySrc: map[string]map[string][]string{}}
}

// source returns the setter for one source's zones.
func (u *zoneUnion) source(name string) func(context.Context, map[string][]string) error {
	return func(ctx context.Context, zones map[string][]string) error {
		u.mu.Lock()
		defer u.mu.Unlock()
		prev, had := u.bySrc[name]
		before := u.mergedLocked()
		u.bySrc[name] = zones
		after := u.mergedLocked()
		if err := u.set(ctx, after); err != nil {
			if had {
				u.bySrc[name] = prev
			} else {
				delete(u.bySrc, name)
			}
			return err
		}
		var gone []string
		for id := range before {
			if _, ok := after[id]; !ok {
				gone = append(gone, id)
			}
		}
		if len(gone) > 0 && u.gone != nil {
			slices.Sort(gone)
			u.gone(gone)
		}
		return nil
	}
}

func (u *zoneUnion) mergedLocked() map[string][]string {
	all := make([]map[string][]string, 0, len(u.bySrc))
	for _, src := range slices.Sorted(maps.Keys(u.bySrc)) {
		all = append(all, u.bySrc[src])
	}
	return sdnzones.Union(all...)
}

// startZones merges the zones of the sandbox API and of Proxmox's SDN
// running config into the guard's run-time zones, and starts keeping the
// latter current.
func (r *run) startZones(ctx context.Context) error {
	var gone func([]string)
	if r.egress != nil { // started before: a zone gone is forgotten there
		gone = r.egress.Registry.ZonesGone
	}
	r.zones = newZoneUnion(r.guard.SetZones, gone)
	loop, err := StartSDNZones(ctx, r.d.Config.Guard, r.log, r.reg, r.zones.source("sdn"), r.guard)
	if err != nil {
		return fmt.Errorf("sdn zones: %w", err)
	}
	if loop != nil {
		r.parts.Go("sdn zones", loop)
	}
	return nil
}

// interfaceEvents is what the SDN zone watcher needs of the guard: a
// signal after each change of the node's interfaces.
type interfaceEvents interface {
	Subscribe() (<-chan struct{}, func())
}

// StartSDNZones reads Proxmox's SDN running config once (so its zones are
// in force before readiness) and returns the function that keeps them
// current until ctx is done: a poll, and a read at once after every
// interface change the guard reports (a vnet just applied). It returns a
// nil function when [guard] sdn_config is "". A file that cannot be used
// at start is logged and leaves its bridges isolated; it never stops the
// daemon.
func StartSDNZones(ctx context.Context, s config.GuardSection, log *slog.Logger, reg prometheus.Registerer,
	set func(context.Context, map[string][]string) error, events interfaceEvents) (func(context.Context) error, error) {
	if s.SDNConfig == "" {
		log.Info("zones from the sdn running config: off (guard.sdn_config is empty)", "component", "sdn-zones")
		return nil, nil
	}
	met, err := sdnzones.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	w, err := sdnzones.New(sdnzones.Options{Path: s.SDNConfig, Apply: set, Exclude: s.Trusted, Logger: log, Metrics: met})
	if err != nil {
		return nil, err
	}
	if err := w.Sync(ctx); err != nil {
		log.Error("sdn running config not used at start: its bridges stay isolated", "component", "sdn-zones", "err", err)
	}
	return func(ctx context.Context) error {
		sub, unsub := events.Subscribe()
		defer unsub()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		done := make(chan struct{})
		go func() { // kicks the watcher on interface changes; ends with ctx
			defer close(done)
			for {
				select {
				case <-ctx.Done():
					return
				case <-sub:
					w.Kick()
				}
			}
		}()
		err := w.Run(ctx)
		cancel()
		<-done
		if err != nil {
			return fmt.Errorf("sdn zones: %w", err)
		}
		return nil
	}, nil
}
