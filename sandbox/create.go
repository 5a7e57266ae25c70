package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// templateID resolves a template name.
func (m *Engine) templateID(ctx context.Context, name string) (int, error) {
	if id, ok := m.o.Templates[name]; ok {
		return id, nil
	}
	id, err := m.cloner.TemplateID(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return 0, invalid("template", "unknown template %q", name)
	}
	if err != nil {
		return 0, pxErr("look up template "+name, err)
	}
	return id, nil
}

// Create builds a sandbox and returns when every VM answers its agent (a
// VM without one: when Proxmox reports it running); on failure
// everything created is removed.
func (m *Engine) Create(ctx context.Context, req apitype.CreateRequest) (apitype.Sandbox, error) {
	req.VMs = cloneVMRequests(req.VMs)
	if refusals, err := m.resolveSharedVNets(ctx, &req); err != nil {
		return apitype.Sandbox{}, err
	} else if len(refusals) > 0 {
		return apitype.Sandbox{}, refusals[0]
	}
	if sb, ok, err := m.claim(ctx, req); ok {
		return sb, err
	}
	if err := m.checkVMOptionsAllowed(req); err != nil {
		return apitype.Sandbox{}, err
	}
	tmpl := make([]int, len(req.VMs))
	for i, v := range req.VMs {
		id, err := m.templateIDOf(ctx, v.Kind, v.Template)
		if err != nil {
			return apitype.Sandbox{}, err
		}
		tmpl[i] = id
	}
	var names []string
	var vmTmpl []int
	var vmReqs []templateVM
	for i, v := range req.VMs {
		if v.Kind == apitype.KindLXC {
			if err := m.checkCT(ctx, "container template "+v.Template, tmpl[i]); err != nil {
				return apitype.Sandbox{}, err
			}
			continue
		}
		names = append(names, v.Template)
		vmTmpl = append(vmTmpl, tmpl[i])
		vmReqs = append(vmReqs, templateVM{i, v})
	}
	if err := m.checkTemplates(ctx, names, vmTmpl, vmReqs); err != nil {
		return apitype.Sandbox{}, err
	}
	names = make([]string, len(req.VMs))
	for i, v := range req.VMs {
		names[i] = v.Template
	}
	disks := make([]int, len(req.VMs))
	for i, v := range req.VMs {
		disks[i] = v.DiskGiB
	}
	if err := m.checkDiskSizes(ctx, names, disks, tmpl); err != nil {
		return apitype.Sandbox{}, err
	}
	foreign, err := m.clusterSubnets(ctx, false)
	if err != nil {
		return apitype.Sandbox{}, err
	}
	if err := m.macsFreeInCluster(ctx, req); err != nil {
		return apitype.Sandbox{}, err
	}

	var host []netip.Prefix
	if m.o.HostNetworks != nil {
		if host, err = m.o.HostNetworks(ctx); err != nil {
			return apitype.Sandbox{}, fmt.Errorf("create: %w", err)
		}
	}

	now := m.o.Now()
	m.mu.Lock()
	if err := m.macsFreeLocked(req); err != nil {
		m.mu.Unlock()
		return apitype.Sandbox{}, err
	}
	yield, err := m.makeRoomLocked(&req)
	if err != nil {
		m.mu.Unlock()
		return apitype.Sandbox{}, err
	}
	id := m.newIDLocked()
	prefixes, err := m.allocCIDRsLocked(req.Networks, foreign, host)
	if err != nil {
		unyieldLocked(yield)
		m.mu.Unlock()
		m.logHostClash(err, req.Owner)
		return apitype.Sandbox{}, err
	}
	// The record's cancel stops the create (a delete of it); its bounds
	// are build's: CreateTimeout on each side of the SDN apply.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rec := newRecord(id, req, prefixes, now, cancel)
	m.sbx[id] = rec
	m.updateGaugesLocked()
	m.mu.Unlock()
	defer close(rec.created)

	log := m.log.With("sandbox", id)
	if err := m.saveState(); err != nil {
		m.mu.Lock()
		unyieldLocked(yield)
		m.mu.Unlock()
		m.forget(id)
		return apitype.Sandbox{}, err
	}
	m.emitSandbox(apitype.EventCreated, rec, "")
	rctx, rcancel := context.WithTimeout(cctx, m.o.CreateTimeout)
	m.retireAll(rctx, yield, "yield")
	rcancel()
	err = m.build(cctx, rec, tmpl, req.Env)
	if err != nil {
		log.Warn("create failed, tearing down", "err", err)
		tctx, tcancel := context.WithTimeout(context.WithoutCancel(ctx), m.o.TeardownTimeout)
		defer tcancel()
		if terr := m.teardown(tctx, rec); terr != nil {
			log.Error("teardown after failed create", "err", terr)
			m.setState(id, apitype.StateError, fmt.Sprintf("create failed: %v; teardown failed: %v", err, terr))
			return apitype.Sandbox{}, err
		}
		m.forget(id)
		m.emitSandbox(apitype.EventDeleted, rec, "create failed: "+err.Error())
		m.removeEgress(tctx, id, rec.Zone)
		if perr := m.publishZones(tctx); perr != nil {
			log.Error("publish zones after failed create", "err", perr)
		}
		return apitype.Sandbox{}, err
	}
	m.setState(id, apitype.StateReady, "")
	m.emitSandbox(apitype.EventReady, rec, "")
	log.Info("sandbox ready", "vms", len(rec.VMs))
	sb, _ := m.Get(id)
	return sb, nil
}

// newRecord is a new sandbox of req (state creating) with its networks
// in prefixes.
func newRecord(id string, req apitype.CreateRequest, prefixes []netip.Prefix, now time.Time, cancel context.CancelFunc) *record {
	rec := &record{
		Sandbox: apitype.Sandbox{
			ID: id, State: apitype.StateCreating, Owner: req.Owner, Labels: req.Labels,
			CreatedAt: now, ExpiresAt: now.Add(time.Duration(req.TTLSeconds) * time.Second), Zone: id,
		},
		created: make(chan struct{}),
		cancel:  cancel,
		egress:  req.Egress,
	}
	for i, n := range req.Networks {
		rec.autoCIDR = append(rec.autoCIDR, n.CIDR == "auto")
		gw, _, _ := subnetPlan(prefixes[i])
		rec.Networks = append(rec.Networks, withPlanRanges(apitype.Network{
			Name: n.Name, VNet: vnetID(id, i), CIDR: prefixes[i].String(), Gateway: gw.String(),
			DHCP: n.DHCP == nil || *n.DHCP, SNAT: n.SNAT == nil || *n.SNAT, DHCPRanges: slices.Clone(n.DHCPRanges),
		}))
	}
	for _, v := range req.VMs {
		nets := v.Networks
		if v.NoNetwork {
			// an empty list, never nil: the API answers "networks": []
			nets = []string{}
		}
		rec.VMs = append(rec.VMs, apitype.VM{Name: v.Name, Kind: v.Kind, Template: v.Template, Cores: v.Cores, MemoryMiB: v.MemoryMiB, DiskGiB: v.DiskGiB,
			Networks: nets, NoNetwork: v.NoNetwork, NICs: recordNICs(v), Firmware: v.Firmware, CPU: v.CPU, OSType: v.OSType, DiskController: v.DiskController, NICController: v.NICController,
			Agent: noAgentFlag(v.HasAgent())})
	}
	return rec
}

// build creates the zone, vnets, subnets and VMs of rec, and names the
// VMs in their guests (names.go).
//
// CreateTimeout bounds the create's own work before its SDN apply and,
// afresh, after it; the wait for the apply is bounded apart (ApplyTimeout
// for each apply it waits for): on a cluster of many zones the apply alone
// can take longer than a create's own work, and it is not the create's.
func (m *Engine) build(ctx context.Context, rec *record, tmpl []int, env map[string]string) error {
	zctx, zcancel := context.WithTimeout(ctx, m.o.CreateTimeout)
	err := m.buildZone(zctx, rec)
	zcancel()
	if err != nil {
		return err
	}
	if err := m.applySDNFor(ctx, rec); err != nil {
		return err
	}
	vctx, vcancel := withBudget(ctx, m.o.CreateTimeout)
	defer vcancel()
	if err := m.publishZones(vctx); err != nil {
		return budgetErr(vctx, err)
	}
	if err := m.applyEgress(vctx, rec); err != nil {
		return budgetErr(vctx, err)
	}
	if err := m.reserveAddresses(vctx, rec); err != nil {
		return budgetErr(vctx, err)
	}
	if err := m.buildVMs(vctx, rec, tmpl, env); err != nil {
		return budgetErr(vctx, err)
	}
	m.mu.Lock()
	owner := rec.Owner
	m.mu.Unlock()
	return budgetErr(vctx, m.nameGuests(WithOwner(vctx, owner), rec))
}

// buildZone creates rec's zone, vnets and subnets, pending until the next
// SDN apply.
func (m *Engine) buildZone(ctx context.Context, rec *record) error {
	zones := m.zones
	id := rec.ID
	alias := nodeTag(m.o.Node) + " " + sandboxTag(id)
	if err := m.pools.EnsurePool(ctx, m.o.Pool); err != nil {
		return pxErr("ensure pool", err)
	}
	if err := zones.CreateZone(ctx, ZoneSpec{ID: id}); err != nil {
		return pxErr("create zone "+id, err)
	}
	for i, n := range rec.Networks {
		if err := zones.CreateVNet(ctx, VNetSpec{ID: n.VNet, Zone: id, Alias: alias}); err != nil {
			return pxErr("create vnet "+n.VNet, err)
		}
		if err := m.claimSubnet(ctx, rec, i); err != nil {
			return err
		}
	}
	return nil
}

// buildVMs clones, starts and waits for every VM of rec, in parallel.
func (m *Engine) buildVMs(ctx context.Context, rec *record, tmpl []int, env map[string]string) error {
	errs := make(chan error, len(rec.VMs))
	// the guest calls of the build (agent pings, the secrets file) are
	// charged to the sandbox's owner, or the pool's for a pool member
	m.mu.Lock()
	owner := rec.Owner
	if rec.member != nil {
		owner = PoolOwner
	}
	m.mu.Unlock()
	vctx, cancel := context.WithCancel(WithOwner(ctx, owner))
	defer cancel()
	var wg sync.WaitGroup
	for i := range rec.VMs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.buildVM(vctx, rec, i, tmpl[i], env); err != nil {
				cancel()
				errs <- fmt.Errorf("vm %s: %w", rec.VMs[i].Name, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	var first error
	for err := range errs {
		if first == nil || errors.Is(first, context.Canceled) {
			first = err
		}
	}
	return first
}

// cloneLeftNothing reports whether a clone that failed with err made
// nothing that stays: Proxmox answered (the clone was refused, or its task
// failed and qemu-server's clone_vm cleaned up after it). A clone whose
// wait was cut (the context, the node not answering) may still run: its
// id stays recorded for the teardown.
func cloneLeftNothing(err error) bool {
	var ue *url.Error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), errors.As(err, &ue):
		return false
	}
	return true
}

// newIDLocked reports whether a clone to id failed because another task
// of the node held id's config lock past the lock's timeout ("can't lock
// file '/var/lock/qemu-server/lock-<id>.conf' - got timeout": a destroy
// or another clone of that id still running, as the emulator's per-VM
// lock models; CI saw it in the three-node bed): the clone made nothing,
// and another id is tried, as after a collision.
func newIDLocked(err error, id int) bool {
	return err != nil && strings.Contains(err.Error(), fmt.Sprintf("lock-%d.conf' - got timeout", id))
}

// idChecker is a Proxmox API that can say whether one VM id is free
// cluster-wide (pveapi: GET /cluster/nextid?vmid=N).
type idChecker interface {
	VMIDFree(ctx context.Context, id int) (bool, error)
}

const (
	// nextIDWaits and nextIDWait: while NextID answers an id this
	// engine's own clone holds (its temporary config not written yet),
	// allocVMID asks again after nextIDWait, nextIDWaits times.
	nextIDWaits = 20
	nextIDWait  = 100 * time.Millisecond
	// maxIDChecks bounds the ids past a reserved one allocVMID asks the
	// cluster about once it stops waiting.
	maxIDChecks = 16
	// spreadIDs: once a clone lost its id to another node's VM (every
	// node's daemon takes the cluster's lowest free id, and each node's
	// clone_vm checks only its own config files), the next id is picked
	// at random among the spreadIDs ids above the lowest free one, each
	// asked of the cluster: the daemons that lost would otherwise all
	// take the next lowest, and meet there again, in step.
	spreadIDs = 32
	// cloneCollisions is how many clones of one VM may lose their id to
	// another node's before the create fails.
	cloneCollisions = 8
)

// allocVMID reserves a VM id; release it once the clone exists. NextID
// gives the lowest id free in the whole cluster. When that is an id a
// clone of this engine holds (reserved here, not yet in the cluster's
// list), NextID is asked again a little later, the engine's lock not
// held: the clone's temporary config soon takes the id. Only when it
// stays reserved are the ids after it tried, each asked of the cluster
// where the API can say: an id above the lowest free one may be another
// node's VM, and clone_vm, which checks only its own node's config file,
// would fail late, in pmxcfs.
//
// With spread (the last clone lost its id to another node's), the id is
// one of the spreadIDs after the lowest free one, at random, that the
// cluster says is free; when the maxIDChecks ids from there are all
// taken, the lowest free one.
func (m *Engine) allocVMID(ctx context.Context, spread bool) (int, error) {
	for attempt := 0; ; attempt++ {
		id, ok, err := m.tryAllocVMID(ctx, attempt >= nextIDWaits, spread)
		if err != nil || ok {
			return id, err
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("next vm id: %w", ctx.Err())
		case <-time.After(nextIDWait):
		}
	}
}

// tryAllocVMID is one try of allocVMID: ok is false when NextID gave a
// reserved id and neither step nor spread is set; with step it goes past
// the reserved ids, with spread it starts at a random one of the
// spreadIDs ids after NextID's (when the cluster can be asked).
func (m *Engine) tryAllocVMID(ctx context.Context, step, spread bool) (id int, ok bool, err error) {
	m.idMu.Lock()
	defer m.idMu.Unlock()
	id, err = m.cloner.NextID(ctx)
	if err != nil {
		return 0, false, pxErr("next vm id", err)
	}
	check, _ := m.cloner.(idChecker)
	lowest := id
	switch {
	case spread && check != nil:
		id += 1 + rand.IntN(spreadIDs)
	case !m.reserved[id]:
		m.reserved[id] = true
		return id, true, nil
	case !step:
		return 0, false, nil
	}
	for checks := 0; ; id++ {
		if m.reserved[id] {
			continue
		}
		if check == nil {
			break
		}
		if checks == maxIDChecks {
			if spread && !m.reserved[lowest] {
				// The ids above the lowest free one are taken (a
				// cluster with holes in its ids): the lowest it is,
				// as without the spread.
				id = lowest
				break
			}
			return 0, false, fmt.Errorf("next vm id: the %d ids after the ones this node's clones hold are taken; retry when a clone ends", maxIDChecks)
		}
		checks++
		free, err := check.VMIDFree(ctx, id)
		if err != nil {
			return 0, false, pxErr(fmt.Sprintf("is vm id %d free", id), err)
		}
		if free {
			break
		}
	}
	m.reserved[id] = true
	return id, true, nil
}

func (m *Engine) releaseVMID(id int) {
	m.idMu.Lock()
	delete(m.reserved, id)
	m.idMu.Unlock()
}

func (m *Engine) buildVM(ctx context.Context, rec *record, i, tmpl int, env map[string]string) error {
	px := m.cloner
	m.mu.Lock()
	spec := rec.VMs[i]
	m.mu.Unlock()
	var vmid int
	spread := false
	for attempt := 0; ; attempt++ {
		id, err := m.allocVMID(ctx, spread)
		if err != nil {
			return err
		}
		m.mu.Lock()
		rec.VMs[i].VMID = id
		m.mu.Unlock()
		if err := m.saveState(); err != nil {
			m.releaseVMID(id)
			return err
		}
		err = m.cloneToEnd(ctx, spec.Kind, CloneSpec{Template: tmpl, NewID: id, Name: m.vmName(rec.ID, spec.Name), Pool: m.o.Pool})
		m.releaseVMID(id)
		if err != nil && cloneLeftNothing(err) {
			// Another VM had the id (this node's, or another node's
			// found by pmxcfs), or the clone's task failed and
			// qemu-server removed what it had made: nothing of ours is
			// there, so the record must not send a teardown after it
			// (another user's VM may take the id next).
			m.mu.Lock()
			rec.VMs[i].VMID = 0
			m.mu.Unlock()
			if err := m.saveState(); err != nil {
				return err
			}
			if (errors.Is(err, ErrExists) || newIDLocked(err, id)) && attempt+1 < cloneCollisions {
				spread = true
				continue
			}
		}
		if err != nil {
			return pxErr(fmt.Sprintf("clone template %d to %d", tmpl, id), err)
		}
		vmid = id
		break
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("after the clone to %d: %w", vmid, err)
	}
	bridges := make([]string, len(spec.Networks))
	m.mu.Lock()
	for k, n := range spec.Networks {
		bridges[k] = bridgeOf(rec.Networks, n)
	}
	m.mu.Unlock()
	if spec.Kind == apitype.KindLXC {
		return m.buildCT(ctx, rec, spec, vmid, bridges, env)
	}
	cfg := VMConfig{Tags: m.vmTags(rec), Cores: spec.Cores, MemoryMiB: spec.MemoryMiB, Bridges: bridges, MACs: recordMACs(spec),
		OSType: spec.OSType, CPU: spec.CPU, UEFI: spec.Firmware == hardening.FirmwareUEFI, NICModel: spec.NICController, NoAgent: !spec.HasAgent()}
	if err := px.ConfigureVM(ctx, vmid, cfg); err != nil {
		return pxErr(fmt.Sprintf("configure vm %d", vmid), err)
	}
	if err := m.dropRangeAddresses(ctx, rec, i); err != nil {
		return err
	}
	if err := m.hardenClone(ctx, vmid, profileWant(spec)); err != nil {
		return err
	}
	if spec.DiskGiB > 0 {
		if err := px.ResizeDisk(ctx, vmid, spec.DiskGiB); err != nil {
			return pxErr(fmt.Sprintf("resize disk of vm %d", vmid), err)
		}
	}
	m.mu.Lock()
	fixed := len(fixedNICsLocked(rec, i)) > 0
	m.mu.Unlock()
	if err := m.startVM(ctx, px, vmid, fixed); err != nil {
		return pxErr(fmt.Sprintf("start vm %d", vmid), err)
	}
	if !spec.HasAgent() {
		// nothing inside to wait for or write to (vmoptions.go)
		return m.waitRunning(ctx, vmid)
	}
	if err := m.waitAgent(ctx, vmid); err != nil {
		return err
	}
	return m.writeEnv(ctx, vmid, env)
}

// noAgentFlag is a VM's Agent field: false for a VM without a guest
// agent, nil (omitted) for one with it.
func noAgentFlag(agent bool) *bool {
	if agent {
		return nil
	}
	return new(bool)
}

// cloneToEnd clones and waits for the clone task to end even when ctx is
// cancelled: qemu-server's clone_vm goes on without its caller and adds
// the VM to the pool only at its end, so a clone abandoned midway would be
// found by the teardown neither tagged nor in the pool, and left behind.
// Waiting makes the teardown find a finished clone with the name and pool
// this daemon gave it (deleteVM).
func (m *Engine) cloneToEnd(ctx context.Context, kind string, s CloneSpec) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.o.CreateTimeout)
	defer cancel()
	if kind == apitype.KindLXC {
		return m.cloneCT(cctx, s)
	}
	return m.cloner.CloneVM(cctx, s)
}

// vmStarter is the part of the Proxmox API that starts a VM.
type vmStarter interface {
	StartVM(ctx context.Context, vmid int) error
}

// allStarts is the weight of Engine.starts an SDN apply takes: more
// than any number of concurrent starts.
const allStarts = 1 << 30

// startVM starts vmid outside this engine's own SDN applies (starts),
// and, for a VM with a NIC of a fixed address (fixed), outside this
// engine's releases of range addresses (cacheDrops: fixed.go). The wait
// for an apply to end is not the create's work: its budget (withBudget)
// is paused meanwhile, and the wait is bounded by ApplyTimeout.
func (m *Engine) startVM(ctx context.Context, px vmStarter, vmid int, fixed bool) error {
	resume := pauseBudget(ctx)
	gctx, cancel := context.WithTimeout(ctx, m.o.ApplyTimeout)
	err := m.starts.Acquire(gctx, 1)
	cancel()
	resume()
	if err != nil {
		return fmt.Errorf("start vm %d: waiting for this node's SDN apply: %w", vmid, err)
	}
	defer m.starts.Release(1)
	if fixed {
		if err := m.cacheDrops.Acquire(ctx, 1); err != nil {
			return fmt.Errorf("start vm %d: waiting for this node's releases of range addresses: %w", vmid, err)
		}
		defer m.cacheDrops.Release(1)
	}
	return px.StartVM(ctx, vmid)
}
