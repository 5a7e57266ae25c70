package container

import (
	"context"
	"time"

	"github.com/pve-inspect/pve-inspect/bench"
)

// Section is the bench command's container section: a one-container
// sandbox against a one-VM sandbox of the same shape on the bed, cold
// create, exec round trip, pool claim and idle memory, with the issue's
// goals.
func Section(ctx context.Context, cfg bench.Config) error {
	o := Options{}
	if cfg.Quick {
		o = Options{Rounds: 5, Execs: 20, Claims: 3, Idle: 2, Settle: 3 * time.Second}
	}
	_, err := Run(ctx, o, cfg.Out)
	return err
}
