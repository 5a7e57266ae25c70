package scale

import (
	"context"
	"fmt"
	"time"
)

// movePorts moves guest ports off their zone bridge to spare0 and back,
// alternately, each until @guest_ports follows.
func (b *bed) movePorts(ctx context.Context, count int) ([]time.Duration, error) {
	var out []time.Duration
	for i := range count {
		p := b.ports[(i/2)%len(b.ports)]
		away := i%2 == 0
		to := "spare0"
		if !away {
			to = fmt.Sprintf("v%04d", (i/2)%len(b.ports))
		}
		done := b.ev.expect(!away, ifname(p.Name))
		start := time.Now()
		if err := b.n.move(p.Name, to); err != nil {
			return nil, err
		}
		ts, err := done(ctx, maxWait)
		if err != nil {
			return nil, fmt.Errorf("%s to %s: %w", p.Name, to, err)
		}
		out = append(out, latest(ts).Sub(start))
		time.Sleep(20 * time.Millisecond)
	}
	return out, nil
}

// addZones adds zones of two existing bridges through the sandbox API's
// source (the daemon's zone union), each until @zone_peers holds the pair.
func (b *bed) addZones(ctx context.Context, count int) ([]time.Duration, error) {
	api := b.s.setZones("api")
	zones := map[string][]string{}
	var out []time.Duration
	for j := range count {
		a, c := fmt.Sprintf("xa%03d", j), fmt.Sprintf("xb%03d", j)
		zones[fmt.Sprintf("api%03d", j)] = []string{a, c}
		cp := make(map[string][]string, len(zones))
		for k, v := range zones {
			cp[k] = v
		}
		done := b.ev.expect(true, pair(a, c))
		start := time.Now()
		if err := api(ctx, cp); err != nil {
			return nil, err
		}
		ts, err := done(ctx, maxWait)
		if err != nil {
			return nil, fmt.Errorf("zone of %s and %s: %w", a, c, err)
		}
		out = append(out, latest(ts).Sub(start))
	}
	return out, nil
}

// flips turns the lockdown on and off, each until @lockdown follows.
func (b *bed) flips(ctx context.Context, count int) ([]time.Duration, error) {
	var out []time.Duration
	for i := range count {
		on := i%2 == 0
		done := b.ev.expect(on, ifname("eth0"))
		start := time.Now()
		if err := b.s.g.SetLockdown(ctx, on); err != nil {
			return nil, err
		}
		ts, err := done(ctx, maxWait)
		if err != nil {
			return nil, fmt.Errorf("lockdown %v: %w", on, err)
		}
		out = append(out, latest(ts).Sub(start))
	}
	if b.s.g.Switches().Lockdown {
		return out, b.s.g.SetLockdown(ctx, false)
	}
	return out, nil
}
