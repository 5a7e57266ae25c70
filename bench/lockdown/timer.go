package lockdown

import (
	"context"
	"fmt"
	"time"

	"github.com/pve-inspect/pve-inspect/lockdown"
)

// Timer is the reference design's trigger, rebuilt here as the bench's
// baseline: the reference scripts re-assert the lockdown from a systemd
// timer, so a marker change takes effect at the timer's next run and not
// before. Each run, Timer reads Marker (the file the operator, here the
// bench, flips) and mirrors it to Target, the marker of a controller that
// watches nothing else: our enforcement behind the reference's trigger,
// with no option of the controller changed.
type Timer struct {
	Marker string        // the marker the bench flips
	Target string        // the controller's marker
	Period time.Duration // ReferencePeriod for the reference design
}

// Run mirrors the marker once at the start and then every Period, until
// ctx ends (nil) or a mirror fails.
func (t Timer) Run(ctx context.Context) error {
	if t.Period <= 0 {
		return fmt.Errorf("bench timer: period %v", t.Period)
	}
	tick := time.NewTicker(t.Period)
	defer tick.Stop()
	for {
		if err := t.mirror(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// mirror copies the marker's presence to the target; a marker that cannot
// be checked counts as present, as the controller counts it.
func (t Timer) mirror() error {
	on, err := lockdown.MarkerPresent(t.Marker)
	if err != nil {
		on = true
	}
	if err := lockdown.SetMarker(t.Target, on); err != nil {
		return fmt.Errorf("bench timer: %w", err)
	}
	return nil
}
