package neighbour

import (
	"context"

	"github.com/pve-inspect/pve-inspect/bench"
)

// Section is the bench command's neighbour section: tenant B's exec, DNS,
// events and the node's APIs, alone and while tenant A attacks.
func Section(ctx context.Context, cfg bench.Config) error {
	o := Options{}
	if cfg.Quick {
		o.Rounds, o.Events = 20, 2
	}
	_, err := Run(ctx, o, cfg.Out)
	return err
}
