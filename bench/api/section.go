package api

import (
	"context"

	"github.com/pve-inspect/pve-inspect/bench"
)

// Section is the bench command's api section: the sandbox API on the
// emulator and the bed: create and delete, Proxmox calls per lifecycle,
// and exec and file throughput through the API against the guest agent
// client it sits on, and the disk path for large files against the agent
// path.
func Section(ctx context.Context, cfg bench.Config) error {
	o := Options{DiskSizes: []int64{256 << 20, 1 << 30}}
	if cfg.Quick {
		o.Rounds, o.Execs, o.FileRounds, o.DiskSizes = 5, 20, 1, []int64{256 << 20}
	}
	_, err := Run(ctx, o, cfg.Out)
	return err
}
