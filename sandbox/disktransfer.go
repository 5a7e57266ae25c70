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
// hot-plugged disk; diskxfer implements it.
type DiskTransfer interface {
	// Upload writes exactly size bytes of r to the guest file path.
	Upload(ctx context.Context, vmid int, g Guest, path string, r io.Reader, size int64, mode os.FileMode) error
	// Download writes the first size bytes of the guest file path to w,
	// nothing before they are verified.
	Download(ctx context.Context, vmid int, g Guest, path string, size int64, w io.Writer) (int64, error)
}

// useDisk says whether a file of n bytes (-1: unknown) takes the disk path.
func (s *Server) useDisk(n int64) bool {
	return s.o.DiskTransfer != nil && n >= s.o.DiskThreshold
}
