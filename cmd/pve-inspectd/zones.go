package main

import (
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/firewall/sdnzones"
)

// zonePlan is what `plan` knows of the guard's zones: the configured ones
// and those of Proxmox's SDN running config. (Zones the running daemon's
// sandbox API creates are applied by Proxmox and so appear in the running
// config too.)
type zonePlan struct {
	config  map[string][]string
	sdnPath string // "" when [guard] sdn_config is off
	sdn     sdnzones.Snapshot
	sdnErr  error
}

func planZones(s config.GuardSection) zonePlan {
	zp := zonePlan{config: s.Zones, sdnPath: s.SDNConfig}
	if zp.sdnPath != "" {
		zp.sdn, zp.sdnErr = sdnzones.ReadFile(zp.sdnPath)
		for z, vnets := range zp.sdn.Zones { // as the daemon does
			zp.sdn.Zones[z] = slices.DeleteFunc(vnets, func(v string) bool { return slices.Contains(s.Trusted, v) })
		}
	}
	return zp
}

// merged is the zone map the daemon would render at start.
func (zp zonePlan) merged() map[string][]string { return sdnzones.Union(zp.config, zp.sdn.Zones) }

func (zp zonePlan) write(w io.Writer) {
	fmt.Fprintf(w, "zones (vnets of one zone may forward to each other; every other bridge is isolated):\n")
	switch {
	case zp.sdnPath == "":
		fmt.Fprintf(w, "  sdn running config: off (guard.sdn_config is empty)\n")
	case zp.sdnErr != nil:
		fmt.Fprintf(w, "  sdn running config %s: NOT USABLE, the daemon keeps its last good zones: %v\n", zp.sdnPath, zp.sdnErr)
	default:
		fmt.Fprintf(w, "  sdn running config %s: version %d\n", zp.sdnPath, zp.sdn.Version)
	}
	type row struct{ zone, vnets, from string }
	var rows []row
	for _, z := range slices.Sorted(maps.Keys(zp.config)) {
		rows = append(rows, row{z, list(zp.config[z]), "config (guard.zones)"})
	}
	for _, z := range slices.Sorted(maps.Keys(zp.sdn.Zones)) {
		rows = append(rows, row{z, list(zp.sdn.Zones[z]), fmt.Sprintf("sdn running config (version %d)", zp.sdn.Version)})
	}
	if len(rows) == 0 {
		fmt.Fprintf(w, "  (none)\n")
	}
	for _, r := range rows {
		fmt.Fprintf(w, "  %-10s %-40s from %s\n", r.zone, r.vnets, r.from)
	}
	for _, s := range zp.sdn.Skipped {
		fmt.Fprintf(w, "  isolated: %s\n", s)
	}
	fmt.Fprintln(w)
}
