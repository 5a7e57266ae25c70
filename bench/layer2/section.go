package layer2

import (
	"context"

	"github.com/pve-inspect/pve-inspect/bench"
)

// Section is the bench command's layer2 section.
func Section(ctx context.Context, cfg bench.Config) error {
	o := Layer2Options{}
	if cfg.Quick {
		o.Rounds, o.Updates = 3, 20
	}
	_, err := RunLayer2(ctx, o, cfg.Out)
	return err
}
