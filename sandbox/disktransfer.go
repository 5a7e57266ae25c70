package sandbox

import (
	"context"
	"io"
	"os"
	"sync"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// DefaultDiskThreshold is the size from which files go through
// DiskTransfer when one is configured.
const DefaultDiskThreshold = 32 << 20

// DiskTransfer moves large files between the node and a VM through a
// hot-plugged disk: the parts of diskxfer the file calls need
// (diskxfer.Transfer implements it).
type DiskTransfer interface {
	// Upload writes exactly size bytes of r to the guest file path.
	Upload(ctx context.Context, vmid int, g Guest, path string, r io.Reader, size int64, mode os.FileMode) error
	// Download writes the first size bytes of the guest file path to w,
	// nothing before they are verified.
	Download(ctx context.Context, vmid int, g Guest, path string, size int64, w io.Writer) (int64, error)
}

// UseDisk says whether a file of n bytes (-1: unknown) of member vmid
// takes the disk path: a DiskTransfer is configured, n is at least
// DiskThreshold and the member is a Linux VM (a container's files stream
// through the process the daemon runs inside it, whatever their size,
// and the disk path's guest side is Linux sh and mount, which a Windows
// guest has not).
func (m *Engine) UseDisk(vmid int, n int64) bool {
	if m.o.DiskTransfer == nil || n < m.o.DiskThreshold {
		return false
	}
	vm := m.vmOf(vmid)
	return vm.Kind != apitype.KindLXC && !hardening.IsWindows(vm.OSType)
}

// Upload writes exactly size bytes of r to the guest file path of VM vmid,
// through the disk path when UseDisk(size), else through the guest agent.
func (m *Engine) Upload(ctx context.Context, vmid int, path string, r io.Reader, size int64, mode os.FileMode) error {
	if m.UseDisk(vmid, size) {
		done, err := m.busy.begin(vmid, busyTransfer)
		if err != nil {
			return err
		}
		defer done()
		return m.o.DiskTransfer.Upload(ctx, vmid, m.Guest(vmid), path, r, size, mode)
	}
	return m.Guest(vmid).WriteFile(ctx, path, r, mode)
}

// Download writes the first size bytes of the guest file path of VM vmid
// to w through the disk path; call it only when UseDisk(size).
func (m *Engine) Download(ctx context.Context, vmid int, path string, size int64, w io.Writer) (int64, error) {
	if m.o.DiskTransfer == nil {
		return 0, refuse(ErrNotConfigured, "no disk transfer is configured")
	}
	done, err := m.busy.begin(vmid, busyTransfer)
	if err != nil {
		return 0, err
	}
	defer done()
	return m.o.DiskTransfer.Download(ctx, vmid, m.Guest(vmid), path, size, w)
}

// What a VM is busy with: a disk transfer or a snapshot operation.
const (
	busyTransfer = "a disk transfer"
	busySnapshot = "a snapshot or rollback"
)

// vmBusy keeps a VM's disk transfers and its snapshots and rollbacks
// apart. A snapshot taken during a transfer either fails (the transfer
// image on a dir storage is raw, and pve-guest-common's __snapshot_prepare
// refuses a VM with a volume without the snapshot feature) or freezes the
// guest's file systems, while which the guest agent answers only ping,
// sync, info and the fsfreeze commands, so the transfer's guest copy
// stalls and its status polls fail; the snapshot would also hold the
// transfer volume, which the unplug then cannot free. So each refuses
// while the other runs on the VM (ErrConflict: retry when it ends).
type vmBusy struct {
	mu sync.Mutex // guards by
	by map[int]map[string]int
}

// begin marks VM vmid busy with what, or refuses when it is busy with
// the other kind of work; done ends it.
func (b *vmBusy) begin(vmid int, what string) (done func(), err error) {
	other := busySnapshot
	if what == busySnapshot {
		other = busyTransfer
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.by[vmid][other] > 0 {
		return nil, refuse(ErrConflict, "vm %d is busy with %s; retry when it has ended", vmid, other)
	}
	if b.by == nil {
		b.by = map[int]map[string]int{}
	}
	if b.by[vmid] == nil {
		b.by[vmid] = map[string]int{}
	}
	b.by[vmid][what]++
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.by[vmid][what]--; b.by[vmid][what] == 0 {
			delete(b.by[vmid], what)
		}
		if len(b.by[vmid]) == 0 {
			delete(b.by, vmid)
		}
	}, nil
}
