package scale

import (
	"context"

	"github.com/pve-inspect/pve-inspect/bench"
)

// Section is the bench command's scale section: 1, 500 and 2000 bridges
// (and ports); -quick times 10 single bridges and 10 of each change
// instead of 20.
func Section(ctx context.Context, cfg bench.Config) error {
	o := Options{Out: cfg.Out}
	if cfg.Quick {
		o.Singles, o.Changes = 10, 10
	}
	_, err := Run(ctx, o)
	return err
}
