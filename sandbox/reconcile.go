package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// ReconcileReport says what Reconcile did.
type ReconcileReport struct {
	Reattached       []string `json:"reattached"`
	TornDown         []string `json:"torn_down"`
	OrphanVMs        []int    `json:"orphan_vms"`
	OrphanVNets      []string `json:"orphan_vnets"`
	OrphanZones      []string `json:"orphan_zones"`
	MissingVMs       []int    `json:"missing_vms"`
	UntouchedForeign int      `json:"untouched_foreign"`
	// PoolMembers are the warm pool members re-adopted; PoolTornDown those
	// of the state file that were not (not ready, VMs gone or retagged,
	// shape no longer configured).
	PoolMembers  []string `json:"pool_members,omitempty"`
	PoolTornDown []string `json:"pool_torn_down,omitempty"`
	// Failed lists the objects reconcile could not clean up (a VM under a
	// backup lock, an SDN apply that failed): each was logged and the rest
	// carried on; the next start tries again.
	Failed []string `json:"failed,omitempty"`
}

// Reconcile re-attaches the sandboxes of the state file, tears down those
// caught mid-create or mid-delete, re-adopts the warm pool members that are
// still whole (readopt, poolrefill.go), and deletes objects carrying this
// node's tags that belong to no known sandbox or member. Objects without both tags are never
// touched. It fails only when it cannot see the whole picture (the state
// file, the pool, the VM or vnet lists); an object that will not go away is
// logged, listed in Failed, and the rest carried on with.
func (m *Engine) Reconcile(ctx context.Context) (ReconcileReport, error) {
	var rep ReconcileReport
	saved, members, err := m.loadState()
	if err != nil {
		return rep, err
	}
	if err := m.pools.EnsurePool(ctx, m.o.Pool); err != nil {
		return rep, pxErr("ensure pool", err)
	}
	vms, err := m.vms.ListVMs(ctx)
	if err != nil {
		return rep, pxErr("list vms", err)
	}
	if m.o.Containers != nil {
		cts, err := m.o.Containers.ListCTs(ctx)
		if err != nil {
			return rep, pxErr("list containers", err)
		}
		for _, c := range cts {
			c.Kind = apitype.KindLXC
			vms = append(vms, c)
		}
	}
	byID := map[int]VMInfo{}
	for _, v := range vms {
		byID[v.VMID] = v
	}
	known := map[string]bool{}
	for _, s := range saved {
		rec := &record{Sandbox: s, created: make(chan struct{})}
		close(rec.created)
		if s.State == apitype.StateReady || s.State == apitype.StateError {
			missing := false
			for _, v := range s.VMs {
				info, ok := byID[v.VMID]
				owner, tagged := m.ownedBy(info.Tags)
				if !ok || !tagged || owner != s.ID || info.Kind != v.Kind {
					missing = true
					rep.MissingVMs = append(rep.MissingVMs, v.VMID)
				}
			}
			if missing {
				rec.State = apitype.StateError
				rec.Error = "VMs missing after restart"
			}
			m.mu.Lock()
			m.sbx[s.ID] = rec
			m.mu.Unlock()
			known[s.ID] = true
			rep.Reattached = append(rep.Reattached, s.ID)
			continue
		}
		// creating or deleting when the daemon stopped: finish it off.
		if err := m.teardown(ctx, rec); err != nil {
			rep.failed(m, "sandbox "+s.ID, err)
			rec.State = apitype.StateError
			rec.Error = "teardown on start failed: " + err.Error()
			m.mu.Lock()
			m.sbx[s.ID] = rec
			m.mu.Unlock()
			known[s.ID] = true
			continue
		}
		rep.TornDown = append(rep.TornDown, s.ID)
	}
	m.readopt(ctx, members, byID, &rep, known)
	m.mu.Lock()
	m.updateGaugesLocked()
	m.mu.Unlock()
	if err := m.saveState(); err != nil {
		return rep, err
	}
	stuck := map[string]bool{} // orphan sandboxes with a VM that stayed
	for _, v := range vms {
		owner, ok := m.ownedBy(v.Tags)
		if !ok || v.Template {
			if slices.ContainsFunc(v.Tags, func(t string) bool { return strings.HasPrefix(t, "pvei-") }) {
				rep.UntouchedForeign++
			}
			continue
		}
		if known[owner] {
			continue
		}
		if err := m.deleteVM(ctx, owner, v.Kind, v.VMID, ""); err != nil {
			rep.failed(m, fmt.Sprintf("orphan vm %d", v.VMID), err)
			stuck[owner] = true
			continue
		}
		rep.OrphanVMs = append(rep.OrphanVMs, v.VMID)
	}
	vnets, err := m.cleaner.ListVNets(ctx)
	if err != nil {
		return rep, pxErr("list vnets", err)
	}
	zones := map[string]bool{}
	for _, v := range vnets {
		owner, ok := m.ownedBy(aliasTags(v.Alias))
		if !ok || known[owner] || v.Zone != owner {
			continue
		}
		zones[owner] = true
	}
	for z := range zones {
		if stuck[z] { // its network goes with its last VM, next time
			rep.failed(m, "orphan zone "+z, errors.New("a VM of the zone could not be deleted"))
			continue
		}
		var nets []apitype.Network
		cidrs, err := m.vnetSubnets(ctx, vnets, z)
		if err != nil {
			rep.failed(m, "orphan zone "+z, err)
			continue
		}
		for vn, cs := range cidrs {
			for _, c := range cs {
				nets = append(nets, apitype.Network{VNet: vn, CIDR: c})
			}
			rep.OrphanVNets = append(rep.OrphanVNets, vn)
		}
		if err := m.deleteSDN(ctx, z, nets); err != nil {
			rep.failed(m, "orphan zone "+z, err)
			continue
		}
		rep.OrphanZones = append(rep.OrphanZones, z)
	}
	slices.Sort(rep.OrphanVNets)
	slices.Sort(rep.OrphanZones)
	if err := m.publishZones(ctx); err != nil {
		return rep, err
	}
	m.restoreEgress()
	m.restoreNames(ctx)
	return rep, nil
}

// restoreNames hands the Egress's resolver the VM names of every ready
// sandbox the engine kept (EgressNamer: it keeps them in memory only,
// so a start has none). A failure is logged: the guests' /etc/hosts
// still names them.
func (m *Engine) restoreNames(ctx context.Context) {
	if _, ok := m.o.Egress.(EgressNamer); !ok {
		return
	}
	m.mu.Lock()
	var recs []*record
	for _, r := range m.sbx {
		if r.State == apitype.StateReady {
			recs = append(recs, r)
		}
	}
	m.mu.Unlock()
	for _, r := range recs {
		if err := m.nameEgress(ctx, r); err != nil {
			m.log.Error("restore the sandbox's names in the egress resolver", "sandbox", r.ID, "err", err)
		}
	}
}

// restoreEgress hands the egress part the sandboxes the engine has after
// a reconcile (EgressRestorer): their egress record from before the
// start comes back, every other sandbox's is dropped. A failure is
// logged: the record is the daemon's account, not the sandboxes' state.
func (m *Engine) restoreEgress() {
	er, ok := m.o.Egress.(EgressRestorer)
	if !ok {
		return
	}
	m.mu.Lock()
	ids := make([]string, 0, len(m.sbx))
	for id := range m.sbx {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	if err := er.RestoreEgress(ids); err != nil {
		m.log.Error("restore the egress record", "err", err)
	}
}

// failed records and logs an object reconcile could not clean up.
func (r *ReconcileReport) failed(m *Engine, what string, err error) {
	m.log.Error("reconcile: left for the next start", "object", what, "err", err)
	r.Failed = append(r.Failed, what)
}

// vnetSubnets returns the subnets of every vnet in zone.
func (m *Engine) vnetSubnets(ctx context.Context, vnets []VNetInfo, zone string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, v := range vnets {
		if v.Zone != zone {
			continue
		}
		cs, err := m.cleaner.VNetSubnets(ctx, v.ID)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return nil, pxErr("list subnets of "+v.ID, err)
		}
		out[v.ID] = cs
	}
	return out, nil
}
