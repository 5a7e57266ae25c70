package guard

import (
	"context"

	"github.com/pve-inspect/pve-inspect/bench"
)

// Section is the bench command's guard section.
func Section(ctx context.Context, cfg bench.Config) error {
	o := Options{}
	if cfg.Quick {
		o.Rounds, o.RouteChanges = 3, 10
	}
	_, err := Run(ctx, o, cfg.Out)
	return err
}
