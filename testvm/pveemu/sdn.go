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
