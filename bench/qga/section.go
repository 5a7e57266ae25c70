package qga

import (
	"context"

	"github.com/pve-inspect/pve-inspect/bench"
)

// Section is the bench command's qga section: our guest agent client
// against the raw ceiling and the reference path's shape, on a real
// qemu-ga of a bed guest.
func Section(ctx context.Context, cfg bench.Config) error {
	b, g, err := bench.OneGuestBed(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	var sizes []int64 // the defaults: 1, 64 and 512 MiB
	if cfg.Quick {
		sizes = []int64{1 << 20, 64 << 20}
	}
	return Run(ctx, cfg.Out, g.Socket, sizes)
}
