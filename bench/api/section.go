package api

import (
	"context"
	"os"

)

// benchAPI measures the sandbox API on the emulator and the bed: create
// and delete, Proxmox calls per lifecycle, and exec and file throughput
// through the API against the guest agent client it sits on, and the disk
// path for large files against the agent path.
func benchAPI(ctx context.Context, cfg config) error {
	o := Options{DiskSizes: []int64{256 << 20, 1 << 30}}
	if cfg.quick {
		o.Rounds, o.Execs, o.FileRounds, o.DiskSizes = 5, 20, 1, []int64{256 << 20}
	}
	_, err := Run(ctx, o, os.Stdout)
	return err
}
