package pool

import (
	"context"

	"github.com/pve-inspect/pve-inspect/bench"
)

// Section is the bench command's pool section: a claim from the warm pool
// against a cold create of the same shape, the Proxmox calls of a claim,
// and 20 creates back to back against a pool of 4.
func Section(ctx context.Context, cfg bench.Config) error {
	o := Options{}
	if cfg.Quick {
		o.Rounds = 5
	}
	_, err := Run(ctx, o, cfg.Out)
	return err
}
