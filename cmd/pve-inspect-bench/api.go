package main

import (
	"context"
	"os"

	"github.com/pve-inspect/pve-inspect/testvm/apibench"
)

// benchAPI measures the sandbox API on the emulator and the bed: create
// and delete, Proxmox calls per lifecycle, and exec and file throughput
// through the API against the guest agent client it sits on.
func benchAPI(ctx context.Context, cfg config) error {
	o := apibench.Options{}
	if cfg.quick {
		o.Rounds, o.Execs, o.FileRounds = 5, 20, 1
	}
	_, err := apibench.Run(ctx, o, os.Stdout)
	return err
}
