package pveemu

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"time"
)

type pool struct {
	id      string
	comment string
	vms     map[int]bool
	storage map[string]bool
}

// AddPool creates a resource pool.
func (s *Server) AddPool(poolid, comment string) error {
	if err := namedFormats["pve-poolid"](poolid); err != nil {
		return fmt.Errorf("pveemu: add pool: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pools[poolid] != nil {
		return fmt.Errorf("pveemu: pool '%s' already exists", poolid)
	}
	s.pools[poolid] = &pool{id: poolid, comment: comment, vms: map[int]bool{}, storage: map[string]bool{}}
	return nil
}

// AddPoolStorage makes a storage a member of a pool, as
// "pveum pool modify <pool> --storage <sid>" does: the pool's ACLs then
// reach /storage/<sid>.
func (s *Server) AddPoolStorage(poolid, storage string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pools[poolid]
	if p == nil {
		return fmt.Errorf("pveemu: pool '%s' does not exist", poolid)
	}
	if !s.storages[storage] {
		return fmt.Errorf("pveemu: storage '%s' does not exist", storage)
	}
	p.storage[storage] = true
	return nil
}

func (s *Server) version(_ context.Context, _ *request) (any, error) {
	return map[string]any{"version": releases[s.release], "release": string(s.release), "repoid": "pveemu", "console": "xtermjs"}, nil
}

// nodes is GET /nodes (pve-manager API2/Nodes.pm index): every cluster
// node, an offline one with status "offline" and no usage figures.
func (s *Server) nodes(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, name := range s.nodeNames {
		e := map[string]any{"node": name, "status": "offline", "id": "node/" + name, "type": "node", "level": "", "ssl_fingerprint": ""}
		if s.members[name].online {
			e["status"] = "online"
			e["uptime"], e["maxcpu"], e["maxmem"] = 1000, 2, 4<<30
		}
		out = append(out, e)
	}
	return out, nil
}

// nodeStatusWord is a node's status in /nodes and /cluster/resources.
func (s *Server) nodeStatusWordLocked(name string) string {
	if n := s.members[name]; n != nil && n.online {
		return "online"
	}
	return "offline"
}

func (s *Server) nextID(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rq.has("vmid") {
		id := rq.int("vmid", 0)
		if _, ok := s.vms[id]; ok {
			// the answer to "is N free?" (the daemon asks it), not a
			// malformed request
			return nil, paramAnswer(ParamErrors{"vmid": fmt.Sprintf("VM %d already exists", id)})
		}
		return strconv.Itoa(id), nil
	}
	for i := 100; i < 1000*1000; i++ {
		if _, ok := s.vms[i]; !ok {
			return strconv.Itoa(i), nil
		}
	}
	return nil, fail("unable to get any free VMID in range [100, 1000000]")
}

func (s *Server) resources(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	typ := rq.str("type")
	out := []map[string]any{}
	if typ == "" || typ == "vm" {
		for _, id := range sortedVMIDs(s.vms) {
			if !s.privilegesLocked(rq.authid, fmt.Sprintf("/vms/%d", id))["VM.Audit"] {
				continue
			}
			v := s.vms[id]
			e := s.vmStatsLocked(v)
			e["id"] = fmt.Sprintf("%s/%d", v.kind.resourceType(), id)
			e["type"] = v.kind.resourceType()
			e["node"] = s.vmNodeLocked(v)
			e["vmid"] = id
			// Only lock and tags are read from the config on every call
			// (get_guest_config_properties); the pool from user.cfg.
			delete(e, "lock")
			delete(e, "tags")
			if l := v.conf["lock"]; l != "" {
				e["lock"] = l
			}
			if t := v.conf["tags"]; t != "" {
				e["tags"] = t
			}
			if v.pool != "" {
				e["pool"] = v.pool
			}
			out = append(out, e)
		}
	}
	if typ == "" || typ == "node" {
		for _, node := range s.nodeNames {
			if s.privilegesLocked(rq.authid, "/nodes/"+node)["Sys.Audit"] {
				out = append(out, map[string]any{"id": "node/" + node, "type": "node", "node": node, "status": s.nodeStatusWordLocked(node), "maxcpu": 2, "maxmem": 4 << 30})
			}
		}
	}
	if typ == "" || typ == "storage" {
		if s.privilegesLocked(rq.authid, "/storage/local-lvm")["Datastore.Audit"] {
			for _, node := range s.nodeNames {
				out = append(out, map[string]any{"id": "storage/" + node + "/local-lvm", "type": "storage", "node": node, "storage": "local-lvm", "status": "available", "content": "images,rootdir", "plugintype": "lvmthin", "shared": 0})
			}
		}
	}
	if typ == "" || typ == "sdn" {
		// Each node reports the zones its network runs.
		for _, node := range s.nodeNames {
			for _, z := range sortedKeys(s.members[node].applied.zones) {
				if s.canSDN(rq.authid, "/sdn/zones/"+z) {
					out = append(out, map[string]any{"id": "sdn/" + node + "/" + z, "type": "sdn", "sdn": z, "node": node, "status": "ok"})
				}
			}
		}
	}
	if typ == "" {
		for _, p := range sortedKeys(s.pools) {
			if s.privilegesLocked(rq.authid, "/pool/"+p)["Pool.Audit"] {
				out = append(out, map[string]any{"id": "/pool/" + p, "type": "pool", "pool": p})
			}
		}
	}
	return out, nil
}

// statsLoop refreshes the published VM statistics every interval, like
// pvestatd's update loop, until the server closes.
func (s *Server) statsLoop(interval time.Duration) {
	defer s.wg.Done()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-tick.C:
			s.mu.Lock()
			s.refreshStatsLocked()
			s.mu.Unlock()
		}
	}
}

// refreshStatsLocked publishes every VM's current statistics.
func (s *Server) refreshStatsLocked() {
	st := map[int]map[string]any{}
	for id, v := range s.vms {
		e := s.guestStatusLocked(v)
		e["template"] = boolInt(v.conf["template"] == "1")
		e["maxcpu"] = e["cpus"]
		delete(e, "cpus")
		delete(e, "pid")
		delete(e, "qmpstatus")
		delete(e, "agent")
		delete(e, "swap")
		delete(e, "maxswap")
		st[id] = e
	}
	s.stats = st
}

// RefreshStats publishes the VMs' statistics now, as a pvestatd update
// would (tests use it instead of waiting for StatsInterval).
func (s *Server) RefreshStats() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stats != nil {
		s.refreshStatsLocked()
	}
}

// vmStatsLocked is a VM's entry in /cluster/resources before the live
// properties are added (pve-manager PVE/API2Tools.pm extract_vm_stats):
// what the last refresh published, or status "unknown" and no name when
// none has seen the VM yet.
func (s *Server) vmStatsLocked(v *vm) map[string]any {
	if s.stats == nil {
		e := s.guestStatusLocked(v)
		e["template"] = boolInt(v.conf["template"] == "1")
		e["maxcpu"] = e["cpus"]
		delete(e, "cpus")
		return e
	}
	if e, ok := s.stats[v.vmid]; ok {
		return maps.Clone(e)
	}
	return map[string]any{"status": "unknown"}
}

func (s *Server) poolMembers(p *pool) []map[string]any {
	members := []map[string]any{}
	for _, id := range sortedVMIDs(toVMMap(s.vms, p.vms)) {
		v := s.vms[id]
		e := s.guestStatusLocked(v)
		e["id"] = fmt.Sprintf("%s/%d", v.kind.resourceType(), id)
		e["type"] = v.kind.resourceType()
		e["node"] = s.vmNodeLocked(s.vms[id])
		members = append(members, e)
	}
	return members
}

func toVMMap(all map[int]*vm, ids map[int]bool) map[int]*vm {
	out := map[int]*vm{}
	for id := range ids {
		if v := all[id]; v != nil {
			out[id] = v
		}
	}
	return out
}

func (s *Server) listPools(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	want := rq.str("poolid")
	for _, id := range sortedKeys(s.pools) {
		if want != "" && id != want {
			continue
		}
		if !s.privilegesLocked(rq.authid, "/pool/"+id)["Pool.Audit"] {
			continue
		}
		p := s.pools[id]
		e := map[string]any{"poolid": id}
		if p.comment != "" {
			e["comment"] = p.comment
		}
		if want != "" {
			e["members"] = s.poolMembers(p)
		}
		out = append(out, e)
	}
	return out, nil
}

func (s *Server) createPool(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := rq.str("poolid")
	if s.pools[id] != nil {
		return nil, fail("create pool failed: pool '%s' already exists", id)
	}
	s.pools[id] = &pool{id: id, comment: rq.str("comment"), vms: map[int]bool{}, storage: map[string]bool{}}
	return nil, nil
}

func (s *Server) getPool(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pools[rq.str("poolid")]
	if p == nil {
		return nil, fail("pool '%s' does not exist", rq.str("poolid"))
	}
	members := s.poolMembers(p)
	for _, sid := range sortedKeys(p.storage) {
		members = append(members, map[string]any{"id": "storage/" + s.node + "/" + sid, "type": "storage", "storage": sid, "node": s.node})
	}
	out := map[string]any{"members": members}
	if p.comment != "" {
		out["comment"] = p.comment
	}
	return out, nil
}

func (s *Server) updatePool(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := rq.str("poolid")
	p := s.pools[id]
	if p == nil {
		return nil, fail("pool '%s' does not exist", id)
	}
	if rq.has("comment") {
		p.comment = rq.str("comment")
	}
	del := rq.bool("delete", false)
	for _, vs := range splitList(rq.str("vms")) {
		vmid, _ := strconv.Atoi(vs)
		v := s.vms[vmid]
		if v == nil {
			return nil, fail("no such VM '%s'", vs)
		}
		if err := s.checkPrivsLocked(rq.authid, "/vms/"+vs, []string{"VM.Allocate"}); err != nil {
			return nil, err
		}
		if del {
			delete(p.vms, vmid)
			if v.pool == id {
				v.pool = ""
			}
			continue
		}
		if v.pool != "" && v.pool != id {
			if !rq.bool("allow-move", false) {
				return nil, fail("VM %d belongs already to pool '%s' and 'allow-move' is not set", vmid, v.pool)
			}
			delete(s.pools[v.pool].vms, vmid)
		}
		v.pool = id
		p.vms[vmid] = true
	}
	for _, sid := range splitList(rq.str("storage")) {
		// check_perm_modify on /storage/<sid>: Permissions.Modify.
		if err := s.checkPrivsLocked(rq.authid, "/storage/"+sid, []string{"Permissions.Modify"}); err != nil {
			return nil, err
		}
		if del {
			if !p.storage[sid] {
				return nil, fail("update pools failed: Storage '%s' is not a pool member", sid)
			}
			delete(p.storage, sid)
			continue
		}
		if p.storage[sid] {
			return nil, fail("update pools failed: Storage '%s' is already a pool member", sid)
		}
		p.storage[sid] = true
	}
	return nil, nil
}

func (s *Server) deletePool(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := rq.str("poolid")
	p := s.pools[id]
	if p == nil {
		return nil, fail("delete pool failed: pool '%s' does not exist", id)
	}
	if len(p.vms) > 0 {
		return nil, fail("delete pool failed: pool '%s' is not empty", id)
	}
	delete(s.pools, id)
	return nil, nil
}

// clusterStatus is GET /cluster/status (pve-manager API2/Cluster.pm
// get_status): a single node lists itself; a cluster has a "cluster" entry
// (quorate while more than half the nodes are up) and one per node, the
// one whose API was called "local".
func (s *Server) clusterStatus(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	local := rq.local
	if local == "" {
		local = s.node
	}
	out := []map[string]any{}
	up := 0
	for i, name := range s.nodeNames {
		online := s.members[name].online
		if online {
			up++
		}
		out = append(out, map[string]any{"type": "node", "name": name, "id": "node/" + name, "nodeid": s.members[name].nodeid,
			"online": boolInt(online), "local": boolInt(name == local), "ip": fmt.Sprintf("192.0.2.%d", 2+i), "level": ""})
	}
	if len(s.nodeNames) > 1 {
		out = append([]map[string]any{{"type": "cluster", "name": "pveemu", "id": "cluster", "nodes": len(s.nodeNames),
			"quorate": boolInt(2*up > len(s.nodeNames)), "version": len(s.nodeNames)}}, out...)
	}
	return out, nil
}

func (s *Server) nodeStatus(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	return map[string]any{
		"uptime": 1000, "cpu": 0.01, "loadavg": []string{"0.00", "0.00", "0.00"}, "kversion": "Linux 6.14.8-2-pve", "pveversion": "pve-manager/9.1.3/pveemu",
		"memory":    map[string]any{"total": 4 << 30, "used": 1 << 30, "free": 3 << 30},
		"swap":      map[string]any{"total": 0, "used": 0, "free": 0},
		"rootfs":    map[string]any{"total": 64 << 30, "used": 8 << 30, "free": 56 << 30, "avail": 56 << 30},
		"cpuinfo":   map[string]any{"cpus": 2, "cores": 2, "sockets": 1, "model": "pveemu", "mhz": "2000", "hvm": "1"},
		"boot-info": map[string]any{"mode": "efi", "secureboot": 0},
	}, nil
}
