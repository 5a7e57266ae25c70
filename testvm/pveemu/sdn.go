package pveemu

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"
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
	return nil, lockFail(errmsg, err)
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
				spec.DHCP = dhcpRanges(r)
			}
			spec.StaticDHCP = sn["dhcp-range"] == "" && o.zones[zone]["dhcp"] != ""
			break
		}
		z.VNets = append(z.VNets, spec)
	}
	return z
}

func zoneChanged(a, b sdnObjects, zone string) bool {
	return fmt.Sprint(zoneSpec(a, zone)) != fmt.Sprint(zoneSpec(b, zone)) || fmt.Sprint(a.zones[zone]) != fmt.Sprint(b.zones[zone])
}

// applySDN is PUT /cluster/sdn (pve-network API2/Network/SDN.pm reload):
// commit_config makes the pending configuration the running one in the
// call itself, whatever the nodes' reloads then do; the worker
// (reloadnetworkall, on the node whose API was called) reloads the network
// of every cluster node in turn and only warns for one that fails. Nothing
// serialises two applies: reloadnetworkall and reload_network_config take
// no lock, and a node's reload that starts while another runs there is
// lost (reloadNode).
func (s *Server) applySDN(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	s.sdn.running = s.sdn.pending.clone()
	s.mu.Unlock()
	return s.startTask(rq, "reloadnetworkall", "", func(ctx context.Context, t *task) error {
		for _, name := range s.nodeNames {
			s.reloadNode(ctx, t, name)
		}
		return nil
	}), nil
}

// DHCPRestarter is a Backend that can restart its zones' DHCP servers, as
// every node's network reload does (pve-network Dhcp/Dnsmasq.pm
// before_regenerate stops every dnsmasq@*, after_configure restarts each
// zone's).
type DHCPRestarter interface {
	RestartDHCP(ctx context.Context) error
}

// reloadNode is one node's network reload within an apply: reloadnetworkall
// runs "pvesh set /nodes/<node>/network" for it, which renames a staged
// interfaces.new, regenerates the SDN network and DHCP configuration from
// the running config and runs ifreload (pve-manager API2/Network.pm
// reload_network_config). A node that is down cannot be reached: the
// command fails and the worker warns. The emulator applies the zones that
// run on the node (their "nodes" list) through its backend, reports a
// backend failure as a warning "<node>: ..." and keeps what the node runs
// in its own applied state, so a zone it refused is retried by the next
// apply; then it restarts the node's DHCP servers.
func (s *Server) reloadNode(ctx context.Context, t *task, name string) {
	s.mu.Lock()
	n := s.members[name]
	backend := s.nodeBackend(name)
	online := n.online
	have := n.applied.clone()
	all := s.sdn.running.clone()
	injected := ""
	if name == s.node && len(s.reloadWarnings) > 0 {
		injected, s.reloadWarnings = s.reloadWarnings[0], s.reloadWarnings[1:]
	}
	s.mu.Unlock()
	t.logf("%s: reloading network config", name)
	if !online {
		// run_command dies, $create_reload_network_worker's caller warns.
		t.logf("proxy handshake failed: No route to host")
		t.warn("command 'pvesh set /nodes/%s/network --regenerate-frr 0' failed: exit code 255", name)
		return
	}
	if injected != "" {
		// The node's reload worker died: nothing of this apply reaches
		// the node's network.
		t.warn("%s: %s", name, injected)
		return
	}
	// ifupdown2 takes its lock without waiting: an ifreload that finds
	// another running on the node exits at once, and its error line
	// ("error: another instance of this program is already running")
	// matches none of the patterns reload_network_config's errfunc prints,
	// so the node's task ends OK with nothing of this apply made there.
	s.mu.Lock()
	if n.reloading {
		s.mu.Unlock()
		return
	}
	n.reloading = true
	hold := s.hooks.reloadHeld
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		n.reloading = false
		s.mu.Unlock()
	}()
	// reload_network_config's worker first renames a staged
	// interfaces.new over interfaces: whatever was staged on the node, by
	// anyone, goes live with this apply.
	s.mu.Lock()
	if n.staged != "" {
		t.logf("%s: staged /etc/network/interfaces.new renamed over /etc/network/interfaces", name)
		n.appliedEdits = append(n.appliedEdits, n.staged)
		n.staged = ""
	}
	s.mu.Unlock()
	// generate_dhcp_config: before_regenerate stops every dnsmasq@* of
	// the node, then each zone's is configured and started again.
	s.mu.Lock()
	n.dhcpStopped = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		n.dhcpStopped = false
		s.mu.Unlock()
	}()
	if hold != nil {
		hold(name)
	}
	// The reload's time (ReloadCost): three systemctl calls for every DHCP
	// zone of the cluster, this node's or not, with the node's dnsmasqs
	// stopped throughout.
	nDHCP := dhcpZones(all)
	t.logf("%s: regenerating dnsmasq for %d DHCP zones of the cluster", name, nDHCP)
	if d := s.reloadCost.of(nDHCP); d > 0 {
		select {
		case <-ctx.Done():
			t.warn("%s: reload cut short: %v", name, ctx.Err())
			return
		case <-time.After(d):
		}
	}
	want := newSDNObjects()
	for z, props := range all.zones {
		if zoneOnNode(props, name) {
			copyZone(want, all, z)
		}
	}
	got := have.clone()
	for _, z := range sortedKeys(have.zones) {
		if _, keep := want.zones[z]; keep {
			continue
		}
		t.logf("%s: remove zone %s", name, z)
		if err := backend.RemoveZone(ctx, z); err != nil {
			t.warn("%s: remove zone %s: %v", name, z, err)
			continue
		}
		copyZone(got, want, z)
	}
	for _, z := range sortedKeys(want.zones) {
		if _, had := have.zones[z]; had && !zoneChanged(want, have, z) {
			continue
		}
		t.logf("%s: apply zone %s", name, z)
		if err := backend.ApplyZone(ctx, zoneSpec(want, z)); err != nil {
			t.warn("%s: apply zone %s: %v", name, z, err)
			continue
		}
		copyZone(got, want, z)
	}
	s.mu.Lock()
	n.applied = got
	s.mu.Unlock()
	if r, ok := backend.(DHCPRestarter); ok && len(got.zones) > 0 {
		if err := r.RestartDHCP(ctx); err != nil {
			t.warn("%s: restart dnsmasq: %v", name, err)
		}
	}
}

// dhcpZones counts the zones of o with DHCP (pve-network Dhcp.pm
// regenerate_config configures each of them on every node).
func dhcpZones(o sdnObjects) int {
	n := 0
	for _, props := range o.zones {
		if props["dhcp"] != "" {
			n++
		}
	}
	return n
}

// copyZone replaces dst's objects of zone (the zone, its vnets and their
// subnets) with src's; a zone src lacks is removed from dst.
func copyZone(dst, src sdnObjects, zone string) {
	inZone := func(o sdnObjects, vnet string) bool { return o.vnets[vnet]["zone"] == zone }
	for id, sn := range dst.subnets {
		if inZone(dst, sn["vnet"]) {
			delete(dst.subnets, id)
		}
	}
	for id := range dst.vnets {
		if inZone(dst, id) {
			delete(dst.vnets, id)
		}
	}
	delete(dst.zones, zone)
	props, ok := src.zones[zone]
	if !ok {
		return
	}
	dst.zones[zone] = copyConf(props)
	for id, v := range src.vnets {
		if v["zone"] == zone {
			dst.vnets[id] = copyConf(v)
		}
	}
	for id, sn := range src.subnets {
		if inZone(src, sn["vnet"]) {
			dst.subnets[id] = copyConf(sn)
		}
	}
}

// InjectReloadWarning makes the next SDN apply's network reload fail on
// the primary node with msg: the task ends "WARNINGS: 1" with
// "WARN: <node>: msg" in its log, and nothing of that apply reaches the
// node's network (the configuration is committed all the same, and the
// next apply brings the node up to date). Each call fails one more apply.
func (s *Server) InjectReloadWarning(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reloadWarnings = append(s.reloadWarnings, msg)
}
