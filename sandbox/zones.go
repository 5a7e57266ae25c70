package sandbox

import (
	"context"
	"fmt"
)

func (m *Engine) applySDN(ctx context.Context) error {
	m.sdnMu.Lock()
	defer m.sdnMu.Unlock()
	return pxErr("apply sdn", m.zones.ApplySDN(ctx))
}

// publishZones hands every known sandbox zone and its vnets to
// Options.ZonesChanged.
func (m *Engine) publishZones(ctx context.Context) error {
	if m.o.ZonesChanged == nil {
		return nil
	}
	m.zonesMu.Lock()
	defer m.zonesMu.Unlock()
	zones := map[string][]string{}
	m.mu.Lock()
	for _, r := range m.sbx {
		for _, n := range r.Networks {
			zones[r.Zone] = append(zones[r.Zone], n.VNet)
		}
	}
	m.mu.Unlock()
	if err := m.o.ZonesChanged(ctx, zones); err != nil {
		return fmt.Errorf("publish sandbox zones: %w", err)
	}
	return nil
}
