package connlookup

import (
	"context"

	"github.com/pve-inspect/pve-inspect/bench"
)

// Section is the bench command's connlookup section: a guest
// connection's interface by the kernel's ingress index vs by a dump of every
// address, at 100 and 2000 bridges.
func Section(ctx context.Context, cfg bench.Config) error {
	o := Options{}
	if cfg.Quick {
		o.Bridges, o.Rounds, o.Blocks = []int{10, 100}, 20, 2
	}
	_, err := Run(ctx, o, cfg.Out)
	return err
}
