package egress

import (
	"context"

	"github.com/pve-inspect/pve-inspect/bench"
)

// Section is the bench command's egress section.
func Section(ctx context.Context, cfg bench.Config) error {
	o := Options{}
	if cfg.Quick {
		o.Rounds, o.Flows = 5, 100
	}
	_, err := Run(ctx, o, cfg.Out)
	return err
}
