package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Delete deletes a sandbox; deleting an unknown sandbox succeeds.
func (m *Engine) Delete(ctx context.Context, id string) error {
	return m.DeleteBy(ctx, id, "")
}

// DeleteBy is Delete on behalf of by (a token, the local socket: "" when
// unknown); the calls the delete ends, and its deleted event, say who
// deleted the sandbox.
func (m *Engine) DeleteBy(ctx context.Context, id, by string) error {
	return m.deleteBy(ctx, id, by, nil)
}

// deleteBy is DeleteBy, keeping the sandbox's egress record in keep when
// set.
func (m *Engine) deleteBy(ctx context.Context, id, by string, keep *egressKeep) error {
	g := &goneWhy{reason: apitype.ReasonDeleted, why: "it was deleted"}
	if by != "" {
		g.why += " by " + by
	}
	_, err := m.removeIf(ctx, id, func(*record) *goneWhy { return g }, nil, keep)
	return err
}

// removeIf deletes a sandbox when cond, called under the lock at the
// moment the sandbox turns to deleting, says why it goes (nil: it stays).
// announce, when set, is called once the sandbox has turned to deleting,
// after the lock is released (what it publishes must never be published
// under m.mu). keep, when set, takes the sandbox's egress record where
// the delete would drop it (DeleteKeepingEgress); the reaper's and the
// pool's deletes keep nothing. It reports whether the sandbox was deleted
// (or already gone).
func (m *Engine) removeIf(ctx context.Context, id string, cond func(*record) *goneWhy, announce func(), keep *egressKeep) (bool, error) {
	m.mu.Lock()
	r, ok := m.sbx[id]
	if !ok {
		m.mu.Unlock()
		return true, nil
	}
	switch {
	case r.State == apitype.StateCreating && keep != nil:
		// its record reads empty until it is ready (a claimed member's
		// is still the member's): nothing to hand over, and cancelling
		// the create would delete it under a refusal
		m.mu.Unlock()
		return false, refuse(ErrConflict, "sandbox %s is being created: its egress record reads empty until it is ready, so a delete keeping it is refused (nothing was deleted); delete it without keeping its record, or once it is ready", id)
	case r.State == apitype.StateCreating:
		created := r.created
		r.cancel()
		m.mu.Unlock()
		select {
		case <-created:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		return m.removeIf(ctx, id, cond, announce, keep)
	case r.deleted != nil:
		d := r.deleted
		m.mu.Unlock()
		select {
		case <-d:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		return m.removeIf(ctx, id, cond, announce, keep)
	}
	g := cond(r)
	if g == nil {
		m.mu.Unlock()
		return false, nil
	}
	r.State = apitype.StateDeleting
	r.gone = g
	r.deleted = make(chan struct{})
	if r.opsCancel != nil {
		r.opsCancel(errDeleted)
		r.opsCtx, r.opsCancel = nil, nil
	}
	d := r.deleted
	m.updateGaugesLocked()
	m.mu.Unlock()
	defer close(d)
	if announce != nil {
		announce()
	}
	if err := m.saveState(); err != nil {
		return false, err
	}
	if err := waitOps(ctx, &r.ops); err != nil {
		m.mu.Lock()
		r.deleted = nil
		m.mu.Unlock()
		m.setState(id, apitype.StateError, "delete: operations still in flight: "+err.Error())
		return false, err
	}
	if err := m.teardown(ctx, r); err != nil {
		m.mu.Lock()
		r.deleted = nil
		m.mu.Unlock()
		m.setState(id, apitype.StateError, "delete failed: "+err.Error())
		return false, err
	}
	m.finalEgressEvent(r)
	if keep != nil {
		m.takeEgress(keep, r)
	}
	m.forget(id)
	m.emitSandbox(apitype.EventDeleted, r, g.why)
	m.removeEgress(ctx, id, r.Zone)
	m.log.Info("sandbox deleted", "sandbox", id)
	if err := m.publishZones(ctx); err != nil {
		m.log.Error("publish zones after delete", "err", err)
	}
	return true, nil
}

// waitOps waits for the operations in flight, or ctx.
func waitOps(ctx context.Context, ops *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() { ops.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for operations in flight: %w", ctx.Err())
	}
}

// teardown removes every Proxmox object of rec that carries (or was
// recorded with) its ownership.
func (m *Engine) teardown(ctx context.Context, rec *record) error {
	m.mu.Lock()
	vms := slices.Clone(rec.VMs)
	nets := slices.Clone(rec.Networks)
	id := rec.ID
	m.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, len(vms))
	for i, v := range vms {
		if v.VMID == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.deleteVM(ctx, id, v.Kind, v.VMID, m.vmName(id, v.Name))
		}()
	}
	wg.Wait()
	err := errors.Join(errs...)
	if err == nil {
		err = m.deleteSDN(ctx, id, nets)
	}
	if err != nil {
		m.forgetGone(rec, vms, errs)
	}
	return err
}

// forgetGone drops from rec, whose teardown failed and which stays, the
// ids of the members its teardown removed from Proxmox (errs[i] nil for
// vms[i]): each id is free for the next guest, of either kind, which
// must never be taken for the member (kindOf, health, a retried delete).
// A teardown that succeeds keeps them: the record goes, and its egress
// record is named by them first.
func (m *Engine) forgetGone(rec *record, vms []apitype.VM, errs []error) {
	gone := false
	m.mu.Lock()
	for i, v := range vms {
		if v.VMID != 0 && errs[i] == nil && i < len(rec.VMs) && rec.VMs[i].VMID == v.VMID {
			rec.VMs[i].VMID, gone = 0, true
		}
	}
	m.mu.Unlock()
	if gone {
		if err := m.saveState(); err != nil {
			m.log.Error("save state after a failed teardown", "sandbox", rec.ID, "err", err)
		}
	}
}

// deleteVM stops and destroys a VM when it is owned by sandbox sb: both tags,
// or (a clone whose tagging failed) the exact name and pool this daemon
// recorded for it. Anything else is left alone.
func (m *Engine) deleteVM(ctx context.Context, sb, kind string, vmid int, wantName string) error {
	px, err := m.opsOf(kind)
	if err != nil {
		return fmt.Errorf("delete member %d: %w", vmid, err)
	}
	info, err := m.settledVM(ctx, px, kind, vmid)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return pxErr(fmt.Sprintf("read vm %d", vmid), err)
	}
	owner, tagged := m.ownedBy(info.Tags)
	switch {
	case info.Template:
		return nil
	case tagged && owner == sb:
	case !tagged && info.Name == wantName && info.Pool == m.o.Pool && !slices.ContainsFunc(info.Tags, func(t string) bool { return strings.HasPrefix(t, "pvei-") }):
	default:
		m.log.Warn("vm id recorded for sandbox is not ours; left alone", "sandbox", sb, "vmid", vmid, "tags", info.Tags, "name", info.Name)
		return nil
	}
	if info.Status != "stopped" {
		if err := px.StopVM(ctx, vmid); err != nil && !errors.Is(err, ErrNotFound) {
			return pxErr(fmt.Sprintf("stop vm %d", vmid), err)
		}
	}
	// What the daemon left in a container's cgroup (exec cgroups) goes
	// while the stopped container still holds its id: once destroyed, the
	// id is free, and the next guest of it (a pool member, another
	// tenant's container) may run in a cgroup of the same path before a
	// sweep after the destroy came.
	// A sweep that leaves something (an exec still ending, a cgroup that
	// would not go) is tried again for a while; the container is not
	// destroyed while it fails: the delete fails and is retried, the id
	// still the container's (lxc could not start its next guest in a
	// cgroup path already there).
	if kind == apitype.KindLXC && m.o.CTSweep != nil {
		if err := m.sweepCT(ctx, vmid); err != nil {
			return fmt.Errorf("delete container %d: what the daemon made in its cgroup did not go, so it stays: %w", vmid, err)
		}
	}
	if err := px.DeleteVM(ctx, vmid); err != nil && !errors.Is(err, ErrNotFound) {
		return pxErr(fmt.Sprintf("delete vm %d", vmid), err)
	}
	return nil
}

// cloneLockPoll is how often deleteVM looks again at a VM still being
// cloned.
const cloneLockPoll = 500 * time.Millisecond

// invisibleCloneWait bounds how long settledVM waits for a VM id that is
// taken but not visible to the token to become visible (a clone still
// running) or free (a clone that failed), and half the teardown's bound
// does too, so that the teardown goes on. Past it the id is another
// user's VM, never ours.
const invisibleCloneWait = 10 * time.Minute

// ctSweepTries and ctSweepEvery bound sweepCT's retries: an exec's own
// cleanup (its kill grace, a few seconds) ends well within them.
const (
	ctSweepTries = 50
	ctSweepEvery = 200 * time.Millisecond
)

// sweepCT runs CTSweep on stopped container vmid until it leaves nothing
// or its tries run out (then its last error).
func (m *Engine) sweepCT(ctx context.Context, vmid int) error {
	var err error
	for range ctSweepTries {
		if err = m.o.CTSweep(vmid); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(ctSweepEvery):
		}
	}
	return err
}

// settledVM reads VM vmid, waiting while it carries qemu-server's "clone"
// lock: a clone still running (its daemon restarted, or its wait failed)
// has neither its name nor its pool yet, and would be judged foreign. A
// clone the token cannot see at all (clone_vm adds the VM to the pool
// last, and the pool's grant reaches members only) reads as not found;
// while the cluster says its id is taken (VMIDFree) it is waited for too,
// up to invisibleCloneWait, so that it is deleted once it lands instead
// of being taken as gone and left behind.
func (m *Engine) settledVM(ctx context.Context, px memberOps, kind string, vmid int) (VMInfo, error) {
	var invisibleSince time.Time
	for {
		info, err := px.VM(ctx, vmid)
		switch {
		case errors.Is(err, ErrNotFound):
			check, ok := m.vms.(idChecker)
			if !ok {
				return info, err
			}
			free, cerr := check.VMIDFree(ctx, vmid)
			if cerr != nil {
				return info, fmt.Errorf("vm %d not visible, and is its id free: %w", vmid, cerr)
			}
			if free {
				return info, err
			}
			if invisibleSince.IsZero() {
				invisibleSince = time.Now()
				m.log.Info("vm id taken but not visible to the token (a clone still running?); waiting before its delete", "vmid", vmid)
			}
			if time.Since(invisibleSince) > min(invisibleCloneWait, m.o.TeardownTimeout/2) {
				m.log.Warn("vm id stays taken by a vm the token cannot see; taken as not ours", "vmid", vmid, "waited", time.Since(invisibleSince))
				return info, err
			}
		case err != nil || info.Lock != busyLock(kind):
			return info, err
		default:
			m.log.Info("vm still being cloned; waiting before its delete", "vmid", vmid)
		}
		select {
		case <-ctx.Done():
			return info, fmt.Errorf("vm %d is still being cloned: %w", vmid, ctx.Err())
		case <-time.After(cloneLockPoll):
		}
	}
}

// deleteSDN removes the sandbox's subnets, vnets (only those whose alias
// carries both tags) and zone, then applies.
func (m *Engine) deleteSDN(ctx context.Context, sb string, nets []apitype.Network) error {
	px := m.cleaner
	all, err := px.ListVNets(ctx)
	if err != nil {
		return pxErr("list vnets", err)
	}
	changed := false
	remaining := 0
	for _, v := range all {
		if v.Zone != sb {
			continue
		}
		owner, ok := m.ownedBy(aliasTags(v.Alias))
		if !ok || owner != sb {
			remaining++
			m.log.Warn("vnet in sandbox zone without our tags; left alone", "vnet", v.ID, "zone", v.Zone)
			continue
		}
		for _, n := range nets {
			if n.VNet == v.ID {
				if err := px.DeleteSubnet(ctx, v.ID, n.CIDR); err != nil && !errors.Is(err, ErrNotFound) {
					return pxErr("delete subnet "+n.CIDR, err)
				}
			}
		}
		if err := px.DeleteVNet(ctx, v.ID); err != nil && !errors.Is(err, ErrNotFound) {
			return pxErr("delete vnet "+v.ID, err)
		}
		changed = true
	}
	if remaining == 0 {
		err := px.DeleteZone(ctx, sb)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return pxErr("delete zone "+sb, err)
		default:
			changed = true
		}
	}
	if changed {
		// The teardown waits for its apply, shared or its own, as long as
		// the apply may take (ApplyTimeout), not only its own bound: an
		// apply of a large cluster outlasts it, and a teardown that gives
		// up leaves the sandbox in error while the apply runs on.
		return m.applySDN(context.WithoutCancel(ctx))
	}
	return nil
}
