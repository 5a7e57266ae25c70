package sandbox

import (
	"context"
	"io"
	"os"
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

// UseDisk says whether a file of n bytes (-1: unknown) takes the disk
// path: a DiskTransfer is configured and n is at least DiskThreshold.
func (m *Engine) UseDisk(n int64) bool {
	return m.o.DiskTransfer != nil && n >= m.o.DiskThreshold
}

// Upload writes exactly size bytes of r to the guest file path of VM vmid,
// through the disk path when UseDisk(size), else through the guest agent.
func (m *Engine) Upload(ctx context.Context, vmid int, path string, r io.Reader, size int64, mode os.FileMode) error {
	if m.UseDisk(size) {
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
	return m.o.DiskTransfer.Download(ctx, vmid, m.Guest(vmid), path, size, w)
}
