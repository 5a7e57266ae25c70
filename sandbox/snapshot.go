package sandbox

import (
	"context"
)

// Snapshot snapshots VM vmid (of an operation begun with Begin).
func (m *Engine) Snapshot(ctx context.Context, vmid int, name string) error {
	done, err := m.busy.begin(vmid, busySnapshot)
	if err != nil {
		return err
	}
	defer done()
	return pxErr("snapshot", m.snaps.Snapshot(ctx, vmid, name))
}

// Rollback rolls VM vmid back to a snapshot and returns once its guest
// agent answers again: a rollback to a snapshot without RAM leaves the VM
// stopped, so it is started.
func (m *Engine) Rollback(ctx context.Context, vmid int, name string) error {
	done, err := m.busy.begin(vmid, busySnapshot)
	if err != nil {
		return err
	}
	defer done()
	defer m.holdHealth(vmid)()
	if err := m.snaps.Rollback(ctx, vmid, name); err != nil {
		return pxErr("rollback", err)
	}
	info, err := m.vms.VM(ctx, vmid)
	if err != nil {
		return pxErr("read vm after rollback", err)
	}
	if info.Status != "running" {
		if err := m.startVM(ctx, m.vms, vmid, false); err != nil {
			return pxErr("start vm after rollback", err)
		}
	}
	return m.waitAgent(ctx, vmid)
}
