package pveemu

import (
	"context"
)

func (s *Server) listZones(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	typ := rq.str("type")
	return listing("zone", s.sdn.pending.zones, s.sdn.running.zones, rq.bool("pending", false), rq.bool("running", false),
		func(id string, p map[string]string) bool {
			return (typ == "" || p["type"] == typ) && s.canSDN(rq.authid, "/sdn/zones/"+id)
		}), nil
}

func (s *Server) getZone(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := rq.str("zone")
	if err := s.checkPrivs(rq.authid, "/sdn/zones/"+id, []string{"SDN.Allocate", "SDN.Audit"}, true); err != nil {
		return nil, err
	}
	src := s.sdn.pending.zones
	if rq.bool("running", false) {
		src = s.sdn.running.zones
	}
	z, ok := src[id]
	if !ok {
		return nil, fail("sdn '%s' does not exist", id)
	}
	return objectMap("zone", id, z), nil
}

var zoneKeys = []string{"type", "dhcp", "ipam", "dns", "dnszone", "reversedns", "nodes", "mtu", "bridge", "tag", "vlan-protocol", "peers", "controller", "vrf-vxlan", "mac", "exitnodes", "rt-import", "advertise-subnets", "disable-arp-nd-suppression", "exitnodes-local-routing", "exitnodes-primary", "bridge-disable-mac-learning", "vxlan-port", "fabric", "dhcp-lease-time", "bgp-mode"}

func (s *Server) createZone(ctx context.Context, rq *request) (any, error) {
	return sdnLocked("create sdn zone object failed", s.createZoneBody(ctx, rq))
}

func (s *Server) createZoneBody(_ context.Context, rq *request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := rq.str("zone")
	if _, ok := s.sdn.pending.zones[id]; ok {
		return fail("sdn zone object ID '%s' already defined", id)
	}
	typ := rq.str("type")
	if typ != "simple" {
		return fail("zone type '%s' is not supported by the emulator (simple only)", typ)
	}
	if ipam := rq.str("ipam"); ipam != "" && ipam != "pve" {
		return paramFail(ParamErrors{"ipam": ipam + " not existing"})
	}
	if dns := rq.str("dns"); dns != "" {
		return paramFail(ParamErrors{"dns": dns + " don't exist"})
	}
	z := map[string]string{}
	for _, k := range zoneKeys {
		if rq.has(k) {
			z[k] = rq.str(k)
		}
	}
	if _, ok := z["ipam"]; !ok {
		z["ipam"] = "pve"
	}
	s.sdn.pending.zones[id] = z
	return nil
}

func (s *Server) deleteZone(ctx context.Context, rq *request) (any, error) {
	return sdnLocked("delete sdn zone object failed", s.deleteZoneBody(ctx, rq))
}

func (s *Server) deleteZoneBody(_ context.Context, rq *request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := rq.str("zone")
	if _, ok := s.sdn.pending.zones[id]; !ok {
		return fail("sdn '%s' does not exist", id)
	}
	for _, vn := range sortedKeys(s.sdn.pending.vnets) {
		if s.sdn.pending.vnets[vn]["zone"] == id {
			return fail("zone %s is used by vnet %s", id, vn)
		}
	}
	delete(s.sdn.pending.zones, id)
	return nil
}
