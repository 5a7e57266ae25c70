package firewall

import (
	"context"
	"fmt"
	"slices"
)

// zoneBridges are the bridges of every zone in cfg, sorted and unique: the
// bridges whose guest ports the layer-2 table guards.
func zoneBridges(cfg Config) []string {
	var out []string
	for _, b := range cfg.Zones {
		out = append(out, b...)
	}
	return sortedUnique(out)
}

// SetPorts replaces the guest port map of the layer-2 table (port name ->
// MAC and assigned IPv4 addresses), in one batch; rules and counters stay.
// A guest port of a zone bridge that is not in ports may only send DHCP
// requests. Bad input (a bad name, a non-unicast MAC or address, a port
// listed twice) is an error and changes nothing.
func (g *Guard) SetPorts(ctx context.Context, ports []Port) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	clean, err := validatePorts(ports)
	if err != nil {
		return fmt.Errorf("set ports: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.desired == nil {
		// not started: Start renders with these
		g.ports = clean
		return nil
	}
	// by difference: the mapper sends the whole map every few seconds,
	// and an unchanged map costs a comparison
	cs := &changes{}
	portChanges(cs, g.ports, clean)
	if _, err := g.commitLocked(cs); err != nil {
		return fmt.Errorf("set ports: %w", err)
	}
	g.ports = clean
	return nil
}

// Ports returns the current guest port map, sorted by name.
func (g *Guard) Ports() []Port {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Port, len(g.ports))
	for i, p := range g.ports {
		out[i] = Port{Name: p.Name, MAC: slices.Clone(p.MAC), IPv4: slices.Clone(p.IPv4)}
	}
	return out
}

// BridgeDesired returns a copy of the layer-2 ruleset the guard keeps in
// force; nil before Start.
func (g *Guard) BridgeDesired() *Ruleset {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.bridge.snapshot()
}

// UnmappedPorts lists the guest ports without a mapping: they are
// DHCP-only until SetPorts maps them.
func (g *Guard) UnmappedPorts() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return unmappedPorts(g.bridge)
}

func unmappedPorts(rs *Ruleset) []string {
	if rs == nil {
		return nil
	}
	mapped := rs.Set(SetPorts)
	var out []string
	for _, n := range rs.Set(SetGuestPorts).Text {
		if !has(mapped, n) {
			out = append(out, n)
		}
	}
	return out
}
