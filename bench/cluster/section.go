package cluster

import (
	"context"

	"github.com/pve-inspect/pve-inspect/bench"
)

// Section is the bench command's cluster section: creates per minute on
// one node and on three, and an apply's time at 10, 100 and 300 zones,
// with the engine's shared applies against one apply per create.
func Section(ctx context.Context, cfg bench.Config) error {
	o := Options{}
	if cfg.Quick {
		o.Creates, o.Zones, o.Burst = 4, []int{10, 50}, 4
	}
	_, err := Run(ctx, o, cfg.Out)
	return err
}
