package pveemu

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
)

// sdnObjects is one generation of SDN configuration: the pending one
// (zones.cfg, vnets.cfg, subnets.cfg) or the running one (.running-config).
type sdnObjects struct {
	zones   map[string]map[string]string
	vnets   map[string]map[string]string
	subnets map[string]map[string]string // id "<zone>-<ip>-<mask>"
}

type sdnState struct {
	pending sdnObjects
	running sdnObjects
}

func newSDNObjects() sdnObjects {
	return sdnObjects{zones: map[string]map[string]string{}, vnets: map[string]map[string]string{}, subnets: map[string]map[string]string{}}
}

func newSDNState() sdnState { return sdnState{pending: newSDNObjects(), running: newSDNObjects()} }

func (o sdnObjects) clone() sdnObjects {
	c := newSDNObjects()
	for _, p := range [][2]map[string]map[string]string{{o.zones, c.zones}, {o.vnets, c.vnets}, {o.subnets, c.subnets}} {
		for id, props := range p[0] {
			p[1][id] = copyConf(props)
		}
	}
	return c
}

// bridgeRunning reports whether a vnet is applied (its bridge exists).
func (st *sdnState) bridgeRunning(name string) bool {
	_, ok := st.running.vnets[name]
	return ok
}

// listing renders objects like PVE::Network::SDN's pending_config: with
// pending, new objects carry state "new" and their values under "pending",
// changed ones "changed", deleted-but-running ones "deleted".
func listing(idKey string, cfg, running map[string]map[string]string, pending, showRunning bool, keep func(id string, props map[string]string) bool) []map[string]any {
	out := []map[string]any{}
	if showRunning {
		for _, id := range sortedKeys(running) {
			if keep(id, running[id]) {
				out = append(out, objectMap(idKey, id, running[id]))
			}
		}
		return out
	}
	ids := map[string]bool{}
	for id := range cfg {
		ids[id] = true
	}
	if pending {
		for id := range running {
			ids[id] = true
		}
	}
	for _, id := range sortedKeys(ids) {
		c, inCfg := cfg[id]
		r, inRun := running[id]
		props := c
		if !inCfg {
			props = r
		}
		if !keep(id, props) {
			continue
		}
		if !pending {
			out = append(out, objectMap(idKey, id, c))
			continue
		}
		e := map[string]any{idKey: id}
		switch {
		case inCfg && !inRun:
			e["state"] = "new"
			pend := map[string]any{}
			for k, v := range c {
				if k == "type" || k == "vnet" {
					e[k] = v
					continue
				}
				pend[k] = v
			}
			e["pending"] = pend
		case !inCfg && inRun:
			e["state"] = "deleted"
			for k, v := range r {
				e[k] = v
			}
		default:
			pend := map[string]any{}
			for k, v := range c {
				e[k] = v
				if r[k] != v {
					pend[k] = v
					e[k] = r[k]
					if _, ok := r[k]; !ok {
						delete(e, k)
					}
				}
			}
			for k := range r {
				if _, ok := c[k]; !ok {
					pend[k] = nil
					e[k] = r[k]
				}
			}
			if len(pend) > 0 {
				e["state"] = "changed"
				e["pending"] = pend
			}
		}
		out = append(out, e)
	}
	return out
}

func objectMap(idKey, id string, props map[string]string) map[string]any {
	e := map[string]any{idKey: id}
	for k, v := range props {
		e[k] = sdnValue(k, v)
	}
	return e
}

func sdnValue(k, v string) any {
	switch k {
	case "snat", "mtu", "tag", "vlanaware", "isolate-ports":
		var n int
		if _, err := fmt.Sscanf(v, "%d", &n); err == nil {
			return n
		}
	case "dhcp-range":
		// the API decodes each range into an object
		var out []map[string]string
		for _, r := range strings.Split(v, "|") {
			m := map[string]string{}
			for _, part := range strings.Split(r, ",") {
				if k, val, ok := strings.Cut(part, "="); ok {
					m[k] = val
				}
			}
			out = append(out, m)
		}
		return out
	}
	return v
}

// sdnLocked answers an SDN object change made inside pve-network's
// lock_sdn_config: a permission refusal as is, any other error wrapped as
// lock_sdn_domain wraps it ("<errmsg>: <error>", a 500).
func sdnLocked(errmsg string, err error) (any, error) {
	if err == nil {
		return nil, nil
	}
	if ae := asAPIError(err); ae.code == 403 {
		return nil, err
	}
	return nil, sdnFail(errmsg, err)
}

func (s *Server) sdnIndex(_ context.Context, _ *request) (any, error) {
	out := []map[string]any{}
	for _, id := range []string{"vnets", "zones", "controllers", "ipams", "dns", "fabrics"} {
		out = append(out, map[string]any{"id": id})
	}
	return out, nil
}

func (s *Server) canSDN(authid, path string) bool {
	p := s.privilegesLocked(authid, path)
	return p["SDN.Audit"] || p["SDN.Allocate"]
}

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

func (s *Server) listVNets(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return listing("vnet", s.sdn.pending.vnets, s.sdn.running.vnets, rq.bool("pending", false), rq.bool("running", false),
		func(id string, p map[string]string) bool {
			return s.canSDN(rq.authid, "/sdn/zones/"+p["zone"]+"/"+id)
		}), nil
}

func (s *Server) getVNet(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := rq.str("vnet")
	src := s.sdn.pending.vnets
	if rq.bool("running", false) {
		src = s.sdn.running.vnets
	}
	v, ok := src[id]
	if !ok {
		return nil, fail("sdn vnet '%s' does not exist", id)
	}
	if !s.canSDN(rq.authid, "/sdn/zones/"+v["zone"]+"/"+id) {
		return nil, permFail("/sdn/zones/" + v["zone"] + "/" + id + ", SDN.Allocate|SDN.Audit")
	}
	return objectMap("vnet", id, v), nil
}

func (s *Server) createVNet(ctx context.Context, rq *request) (any, error) {
	return sdnLocked("create sdn vnet object failed", s.createVNetBody(ctx, rq))
}

func (s *Server) createVNetBody(_ context.Context, rq *request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, zone := rq.str("vnet"), rq.str("zone")
	if err := s.checkPrivsLocked(rq.authid, "/sdn/zones/"+zone, []string{"SDN.Allocate"}); err != nil {
		return err
	}
	if _, ok := s.sdn.pending.vnets[id]; ok {
		return fail("sdn vnet object ID '%s' already defined", id)
	}
	if _, ok := s.sdn.pending.zones[zone]; !ok {
		return paramFail(ParamErrors{"zone": "zone '" + zone + "' don't exist"})
	}
	if rq.has("tag") {
		return fail("tag is not allowed on simple zones")
	}
	v := map[string]string{"zone": zone, "type": "vnet"}
	for _, k := range []string{"alias", "vlanaware", "isolate-ports"} {
		if rq.has(k) {
			v[k] = rq.str(k)
		}
	}
	s.sdn.pending.vnets[id] = v
	return nil
}

func (s *Server) deleteVNet(ctx context.Context, rq *request) (any, error) {
	return sdnLocked("delete sdn vnet object failed", s.deleteVNetBody(ctx, rq))
}

func (s *Server) deleteVNetBody(_ context.Context, rq *request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := rq.str("vnet")
	v, ok := s.sdn.pending.vnets[id]
	if !ok {
		return fail("sdn vnet '%s' does not exist", id)
	}
	if err := s.checkPrivsLocked(rq.authid, "/sdn/zones/"+v["zone"]+"/"+id, []string{"SDN.Allocate"}); err != nil {
		return err
	}
	for _, sn := range s.sdn.pending.subnets {
		if sn["vnet"] == id {
			return paramFail(ParamErrors{"vnet": "Can't delete vnet if subnets exists"})
		}
	}
	delete(s.sdn.pending.vnets, id)
	return nil
}

func (s *Server) checkPrivsLocked(authid, path string, privs []string) error {
	have := s.privilegesLocked(authid, path)
	for _, p := range privs {
		if !have[p] {
			return permFail(path + ", " + p)
		}
	}
	return nil
}

func subnetID(zone string, p netip.Prefix) string {
	return fmt.Sprintf("%s-%s-%d", zone, p.Addr(), p.Bits())
}

func (s *Server) listSubnets(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	vnet := rq.str("vnet")
	v := s.sdn.pending.vnets[vnet]
	if v == nil {
		v = s.sdn.running.vnets[vnet]
	}
	if v == nil {
		return nil, fail("sdn vnet '%s' does not exist", vnet)
	}
	out := listing("subnet", s.sdn.pending.subnets, s.sdn.running.subnets, rq.bool("pending", false), rq.bool("running", false),
		func(id string, p map[string]string) bool {
			return p["vnet"] == vnet && s.canSDN(rq.authid, "/sdn/zones/"+v["zone"]+"/"+vnet)
		})
	// Subnets::sdn_subnets_config adds these, from the id, to every
	// listed subnet (pending ones too) on top.
	for _, e := range out {
		id, _ := e["subnet"].(string)
		parts := strings.Split(id, "-")
		if len(parts) < 3 {
			continue
		}
		zone, network, mask := strings.Join(parts[:len(parts)-2], "-"), parts[len(parts)-2], parts[len(parts)-1]
		e["id"], e["zone"], e["network"], e["mask"], e["cidr"] = id, zone, network, mask, network+"/"+mask
	}
	return out, nil
}

func (s *Server) findSubnet(src map[string]map[string]string, vnet, sub string) (string, map[string]string) {
	for id, sn := range src {
		if sn["vnet"] != vnet {
			continue
		}
		if id == sub || sn["cidr"] == sub || strings.HasSuffix(id, "-"+strings.ReplaceAll(sub, "/", "-")) {
			return id, sn
		}
	}
	return "", nil
}

func (s *Server) getSubnet(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	vnet := rq.str("vnet")
	src := s.sdn.pending.subnets
	if rq.bool("running", false) {
		src = s.sdn.running.subnets
	}
	id, sn := s.findSubnet(src, vnet, rq.str("subnet"))
	if sn == nil {
		return nil, fail("sdn subnet '%s' does not exist", rq.str("subnet"))
	}
	return objectMap("subnet", id, sn), nil
}

func (s *Server) createSubnet(ctx context.Context, rq *request) (any, error) {
	return sdnLocked("create sdn subnet object failed", s.createSubnetBody(ctx, rq))
}

func (s *Server) createSubnetBody(_ context.Context, rq *request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	vnetID := rq.str("vnet")
	vnet := s.sdn.pending.vnets[vnetID]
	if vnet == nil {
		return paramFail(ParamErrors{"vnet": vnetID + " don't exist"})
	}
	if err := s.checkPrivsLocked(rq.authid, "/sdn/zones/"+vnet["zone"]+"/"+vnetID, []string{"SDN.Allocate"}); err != nil {
		return err
	}
	cidr, err := netip.ParsePrefix(rq.str("subnet"))
	if err != nil {
		return paramFail(ParamErrors{"subnet": "value does not look like a valid CIDR network\n"})
	}
	cidr = cidr.Masked()
	id := subnetID(vnet["zone"], cidr)
	if _, ok := s.sdn.pending.subnets[id]; ok {
		return fail("sdn subnet object ID '%s' already defined", id)
	}
	sn := map[string]string{"vnet": vnetID, "type": "subnet", "cidr": cidr.String(), "network": cidr.Addr().String(), "mask": fmt.Sprint(cidr.Bits()), "zone": vnet["zone"]}
	if gw := rq.str("gateway"); gw != "" {
		a, err := netip.ParseAddr(gw)
		if err != nil || !cidr.Contains(a) {
			return paramFail(ParamErrors{"gateway": fmt.Sprintf("%s is not in subnet %s", gw, cidr)})
		}
		sn["gateway"] = gw
	}
	if rq.has("snat") {
		sn["snat"] = rq.str("snat")
	}
	var ranges []string
	for _, r := range rq.strings("dhcp-range") {
		start, end := "", ""
		for _, part := range strings.Split(r, ",") {
			k, v, _ := strings.Cut(part, "=")
			switch k {
			case "start-address":
				start = v
			case "end-address":
				end = v
			}
		}
		a, err1 := netip.ParseAddr(start)
		b, err2 := netip.ParseAddr(end)
		switch {
		case err1 != nil:
			return paramFail(ParamErrors{"dhcp-range": "start-address is not a valid IP " + start})
		case err2 != nil:
			return paramFail(ParamErrors{"dhcp-range": "end-address is not a valid IP " + end})
		case b.Less(a):
			return paramFail(ParamErrors{"dhcp-range": fmt.Sprintf("start-address %s must be smaller than end-address %s", start, end)})
		case !cidr.Contains(a):
			return paramFail(ParamErrors{"dhcp-range": fmt.Sprintf("start-address %s is not in subnet %s", start, cidr)})
		case !cidr.Contains(b):
			return paramFail(ParamErrors{"dhcp-range": fmt.Sprintf("end-address %s is not in subnet %s", end, cidr)})
		}
		ranges = append(ranges, r)
	}
	if len(ranges) > 0 {
		sn["dhcp-range"] = strings.Join(ranges, "|")
	}
	for _, k := range []string{"dnszoneprefix", "dhcp-dns-server"} {
		if rq.has(k) {
			sn[k] = rq.str(k)
		}
	}
	s.sdn.pending.subnets[id] = sn
	s.ipamAddSubnetLocked(vnet["zone"], cidr.String(), sn["gateway"])
	return nil
}

func (s *Server) deleteSubnet(ctx context.Context, rq *request) (any, error) {
	return sdnLocked("delete sdn subnet object failed", s.deleteSubnetBody(ctx, rq))
}

func (s *Server) deleteSubnetBody(_ context.Context, rq *request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	vnetID := rq.str("vnet")
	id, sn := s.findSubnet(s.sdn.pending.subnets, vnetID, rq.str("subnet"))
	if sn == nil {
		return fail("sdn subnet '%s' does not exist", rq.str("subnet"))
	}
	if err := s.checkPrivsLocked(rq.authid, "/sdn/zones/"+sn["zone"]+"/"+vnetID, []string{"SDN.Allocate"}); err != nil {
		return err
	}
	if err := s.ipamDelSubnetLocked(sn["zone"], sn["cidr"]); err != nil {
		return err
	}
	delete(s.sdn.pending.subnets, id)
	return nil
}

// zoneSpec builds the backend view of a zone from one configuration.
func zoneSpec(o sdnObjects, zone string) ZoneSpec {
	z := ZoneSpec{ID: zone}
	for _, vn := range sortedKeys(o.vnets) {
		if o.vnets[vn]["zone"] != zone {
			continue
		}
		spec := VNetSpec{Name: vn}
		for _, sid := range sortedKeys(o.subnets) {
			sn := o.subnets[sid]
			if sn["vnet"] != vn {
				continue
			}
			spec.Subnet, _ = netip.ParsePrefix(sn["cidr"])
			spec.Gateway, _ = netip.ParseAddr(sn["gateway"])
			spec.SNAT = sn["snat"] == "1"
			if r := sn["dhcp-range"]; r != "" {
				first, _, _ := strings.Cut(r, "|")
				for _, part := range strings.Split(first, ",") {
					k, v, _ := strings.Cut(part, "=")
					switch k {
					case "start-address":
						spec.DHCPStart, _ = netip.ParseAddr(v)
					case "end-address":
						spec.DHCPEnd, _ = netip.ParseAddr(v)
					}
				}
			}
			break
		}
		z.VNets = append(z.VNets, spec)
	}
	return z
}

func zoneChanged(a, b sdnObjects, zone string) bool {
	return fmt.Sprint(zoneSpec(a, zone)) != fmt.Sprint(zoneSpec(b, zone)) || fmt.Sprint(a.zones[zone]) != fmt.Sprint(b.zones[zone])
}

func (s *Server) applySDN(_ context.Context, rq *request) (any, error) {
	return s.startTask(rq.authid, "reloadnetworkall", "", func(ctx context.Context, t *task) error {
		s.mu.Lock()
		want := s.sdn.pending.clone()
		have := s.sdn.running.clone()
		injected := ""
		if len(s.reloadWarnings) > 0 {
			injected, s.reloadWarnings = s.reloadWarnings[0], s.reloadWarnings[1:]
		}
		s.mu.Unlock()
		var failed []string
		if injected != "" {
			// The node's reload worker died: reloadnetworkall only warns
			// (API2/Network/SDN.pm reload: "warn $@ if $@"), and nothing
			// of this apply reaches the node's network.
			t.warn("%s: %s", s.node, injected)
			return nil
		}
		for _, z := range sortedKeys(have.zones) {
			if _, keep := want.zones[z]; keep {
				continue
			}
			t.logf("%s: remove zone %s", s.node, z)
			if err := s.backend.RemoveZone(ctx, z); err != nil {
				t.warn("%s: remove zone %s: %v", s.node, z, err)
				failed = append(failed, z)
			}
		}
		for _, z := range sortedKeys(want.zones) {
			if _, had := have.zones[z]; had && !zoneChanged(want, have, z) {
				continue
			}
			t.logf("%s: apply zone %s", s.node, z)
			if err := s.backend.ApplyZone(ctx, zoneSpec(want, z)); err != nil {
				t.warn("%s: apply zone %s: %v", s.node, z, err)
				failed = append(failed, z)
				delete(want.zones, z)
			}
		}
		// A zone the backend refused stays out of the running config (a
		// removal that failed stays in), so the next apply retries it; the
		// node reports each failure as a warning, like reloadnetworkall.
		for _, z := range failed {
			if _, had := have.zones[z]; had {
				if _, keep := want.zones[z]; !keep {
					want.zones[z] = have.zones[z]
				}
			}
		}
		s.mu.Lock()
		s.sdn.running = want
		s.mu.Unlock()
		return nil
	}), nil
}

// InjectReloadWarning makes the next SDN apply's network reload fail on
// the node with msg: the task ends "WARNINGS: 1" with "WARN: <node>: msg"
// in its log, and nothing of that apply reaches the network (zones and
// vnets stay pending). Each call fails one more apply.
func (s *Server) InjectReloadWarning(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reloadWarnings = append(s.reloadWarnings, msg)
}
