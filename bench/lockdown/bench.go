// Package lockdown measures the egress lockdown's marker-to-enforced
// latency ([Bench]), probed from a guest, against the reference design's
// trigger: a systemd timer every 60 s, rebuilt here as [Timer] in front of
// the same controller (package lockdown of the product has no option for
// it), beside the reference's modelled figure ([ReferenceQuantile]). The
// bench command's lockdown section ([Section]) runs both on the bed.
package lockdown

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"text/tabwriter"
	"time"
)

// The reference design re-asserts the lockdown from a systemd timer every
// 60 s with systemd's timer accuracy of 15 s: a marker change takes effect
// within 75 s in the worst case.
const (
	ReferencePeriod    = 60 * time.Second
	ReferenceAccuracy  = 15 * time.Second
	ReferenceWorstCase = ReferencePeriod + ReferenceAccuracy
)

// ReferenceQuantile is the reference design's latency quantile q (0..1)
// under a uniform phase between the marker change and the next timer run,
// not counting the accuracy slack (so it flatters the reference): q × 60 s.
// It is a model, not a measurement; measure the controller behind a
// [Timer] with ReferencePeriod side by side for a measured figure.
func ReferenceQuantile(q float64) time.Duration {
	return time.Duration(q * float64(ReferencePeriod))
}

// BenchOptions drive [Bench].
type BenchOptions struct {
	// Flips is the number of marker changes, alternating on and off,
	// starting with on. Default 20.
	Flips int
	// SetMarker creates (true) or removes (false) the marker. Required.
	SetMarker func(ctx context.Context, on bool) error
	// Probe tests egress from inside a guest and reports whether it is
	// blocked (for example a TCP connect to the internet host with a short
	// timeout: a timeout is blocked, a connection is not). It is called
	// back to back until it reports the state the marker asks for. An
	// error is not a verdict. Required.
	Probe func(ctx context.Context) (blocked bool, err error)
	// FlipTimeout bounds each flip. Default 2 minutes.
	FlipTimeout time.Duration
	// SettleJitter: before each flip, pause a uniformly random time in
	// [0, SettleJitter) so the flips sample every phase of a periodic
	// enforcer. Set it to the period of a timer baseline.
	SettleJitter time.Duration
	// Confirm is how many further probes in a row must agree before a
	// change counts (a probe on a loaded host can time out without any
	// drop: one "blocked" alone proves nothing). Default 2; -1 for none.
	Confirm int
	// Progress, when set, receives each sample as it is taken.
	Progress func(FlipSample)
}

// FlipSample is one measured marker change.
type FlipSample struct {
	On bool // the marker was created (lockdown asked for)
	// Latency: from just before SetMarker to the start of the first probe
	// of the confirmed run that observed the new state (an upper bound: the
	// state was in force when that probe's traffic left).
	Latency time.Duration
	// Lower: to the start of the last probe that still observed the old
	// state (0 when none did); the change came after it, unless that probe
	// was itself a false reading.
	Lower  time.Duration
	Probes int // probes run for this flip
}

// LatencyStats summarise samples (nearest-rank percentiles).
type LatencyStats struct {
	N             int
	Min, P50, P99 time.Duration
	Max           time.Duration
}

// BenchResult is the outcome of [Bench].
type BenchResult struct {
	On  LatencyStats // marker created -> egress blocked
	Off LatencyStats // marker removed -> egress back
	All LatencyStats
	// OnLower and OffLower summarise the lower bounds (FlipSample.Lower):
	// the true latency lies between them and On/Off, within one probe.
	OnLower, OffLower LatencyStats
	Samples           []FlipSample
}

// Bench flips the marker o.Flips times and measures, by probing from a
// guest, how long each change takes to show. It starts by removing the
// marker and waiting until egress is open; with an even Flips the marker
// ends removed.
func Bench(ctx context.Context, o BenchOptions) (BenchResult, error) {
	if o.SetMarker == nil || o.Probe == nil {
		return BenchResult{}, errors.New("bench: SetMarker and Probe are required")
	}
	if o.Flips <= 0 {
		o.Flips = 20
	}
	if o.FlipTimeout <= 0 {
		o.FlipTimeout = 2 * time.Minute
	}
	switch {
	case o.Confirm == 0:
		o.Confirm = 2
	case o.Confirm < 0:
		o.Confirm = 0
	}
	var res BenchResult
	// Start from a known state: marker off and egress observed open.
	if err := o.SetMarker(ctx, false); err != nil {
		return res, fmt.Errorf("bench: reset marker: %w", err)
	}
	if _, err := flip(ctx, o, false, false); err != nil {
		return res, fmt.Errorf("bench: initial state: %w", err)
	}
	for i := range o.Flips {
		on := i%2 == 0
		if o.SettleJitter > 0 {
			pause := rand.N(o.SettleJitter)
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(pause):
			}
		}
		s, err := flip(ctx, o, on, true)
		if err != nil {
			return res, fmt.Errorf("bench: flip %d (marker %v): %w", i+1, on, err)
		}
		res.Samples = append(res.Samples, s)
		if o.Progress != nil {
			o.Progress(s)
		}
	}
	var on, off, all, onLow, offLow []time.Duration
	for _, s := range res.Samples {
		all = append(all, s.Latency)
		if s.On {
			on, onLow = append(on, s.Latency), append(onLow, s.Lower)
		} else {
			off, offLow = append(off, s.Latency), append(offLow, s.Lower)
		}
	}
	res.On, res.Off, res.All = Stats(on), Stats(off), Stats(all)
	res.OnLower, res.OffLower = Stats(onLow), Stats(offLow)
	return res, nil
}

// flip sets the marker (when set) and probes until the guest observes it.
func flip(ctx context.Context, o BenchOptions, on, set bool) (FlipSample, error) {
	ctx, cancel := context.WithTimeout(ctx, o.FlipTimeout)
	defer cancel()
	s := FlipSample{On: on}
	t0 := time.Now()
	if set {
		if err := o.SetMarker(ctx, on); err != nil {
			return s, fmt.Errorf("set marker: %w", err)
		}
	}
	var (
		lastErr   error
		first     time.Time // start of the first probe of the agreeing run
		agreeing  int
		lastOther time.Time // start of the last probe that saw the old state
	)
	for {
		start := time.Now()
		blocked, err := o.Probe(ctx)
		s.Probes++
		if ctx.Err() != nil {
			return s, fmt.Errorf("not observed within %v (last probe error: %v): %w", o.FlipTimeout, lastErr, ctx.Err())
		}
		if err != nil {
			lastErr = err
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		if blocked != on {
			agreeing, lastOther = 0, start
			continue
		}
		if agreeing == 0 {
			first = start
		}
		agreeing++
		if agreeing > o.Confirm {
			s.Latency = first.Sub(t0)
			if !lastOther.IsZero() {
				s.Lower = lastOther.Sub(t0)
			}
			return s, nil
		}
	}
}

// Stats computes nearest-rank statistics of d.
func Stats(d []time.Duration) LatencyStats {
	if len(d) == 0 {
		return LatencyStats{}
	}
	d = slices.Clone(d)
	slices.Sort(d)
	rank := func(q float64) time.Duration {
		i := int(q*float64(len(d))+0.999999999) - 1
		return d[max(0, min(i, len(d)-1))]
	}
	return LatencyStats{N: len(d), Min: d[0], P50: rank(0.50), P99: rank(0.99), Max: d[len(d)-1]}
}

// WriteBenchReport prints ours (and a measured baseline, when not nil)
// beside the reference design's figure.
func WriteBenchReport(w io.Writer, ours BenchResult, baseline *BenchResult) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "marker-to-enforced latency (probed from a guest)\tn\tp50\tp99\tmax\tp50 lower bound")
	r := func(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
	row := func(name string, s, low LatencyStats) {
		fmt.Fprintf(tw, "%s\t%d\t%v\t%v\t%v\t%v\n", name, s.N, r(s.P50), r(s.P99), r(s.Max), r(low.P50))
	}
	row("pve-inspectd, marker on -> blocked", ours.On, ours.OnLower)
	row("pve-inspectd, marker off -> open", ours.Off, ours.OffLower)
	if baseline != nil {
		row("baseline (poll-only, measured), on -> blocked", baseline.On, baseline.OnLower)
		row("baseline (poll-only, measured), off -> open", baseline.Off, baseline.OffLower)
	}
	fmt.Fprintf(tw, "reference: 60 s timer (model, not measured)\t-\t%v\t%v\t%v (60 s + 15 s accuracy)\t-\n",
		ReferenceQuantile(0.5), ReferenceQuantile(0.99), ReferenceWorstCase)
	return tw.Flush()
}
