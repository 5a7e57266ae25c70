package sandbox

import (
	"context"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Snapshot snapshots VM vmid (of an operation begun with Begin).
func (m *Engine) Snapshot(ctx context.Context, vmid int, name string) error {
	done, err := m.busy.begin(vmid, busySnapshot)
	if err != nil {
		return err
	}
	defer done()
	if m.kindOf(vmid) == apitype.KindLXC {
		if m.o.Containers == nil {
			return errNoContainers()
		}
		return pxErr("snapshot", m.o.Containers.SnapshotCT(ctx, vmid, name))
	}
	return pxErr("snapshot", m.snaps.Snapshot(ctx, vmid, name))
}

// Rollback rolls VM vmid back to a snapshot and returns once its guest
// agent answers again (a VM without one: once Proxmox reports it
// running): a rollback to a snapshot without RAM leaves the VM stopped,
// so it is started.
func (m *Engine) Rollback(ctx context.Context, vmid int, name string) error {
	done, err := m.busy.begin(vmid, busySnapshot)
	if err != nil {
		return err
	}
	defer done()
	defer m.holdHealth(vmid)()
	vm := m.vmOf(vmid)
	kind := vm.Kind
	px, err := m.opsOf(kind)
	if err != nil {
		return err
	}
	if kind == apitype.KindLXC {
		err = m.o.Containers.RollbackCT(ctx, vmid, name)
	} else {
		err = m.snaps.Rollback(ctx, vmid, name)
	}
	if err != nil {
		return pxErr("rollback", err)
	}
	info, err := px.VM(ctx, vmid)
	if err != nil {
		return pxErr("read vm after rollback", err)
	}
	if info.Status != "running" {
		if err := m.startVM(ctx, px, vmid, false); err != nil {
			return pxErr("start vm after rollback", err)
		}
	}
	if !vm.HasAgent() {
		return m.waitRunning(ctx, vmid)
	}
	return m.waitAgent(ctx, vmid)
}
