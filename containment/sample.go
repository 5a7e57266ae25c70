package containment

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/pve-inspect/pve-inspect/containment/probe"
)

// Sampling. A node with many sandboxes has many addresses (every zone
// gateway is one, each worth up to nine control-plane rows) and many other
// guests: the full plan outgrows what one run should take. So a plan has
// a row budget ([Spec].Budget, default [DefaultBudget]); when the full
// plan is over it:
//
//   - every row about the node's own addresses (the VM's own gateway(s),
//     [Spec].HostAddrs), the controls, metadata, DNS, internet, IPv6,
//     egress and layer-2 rows is always probed;
//   - the rows of other zones' gateways ([Spec].OtherGateways), other
//     zones' guests and LAN targets are sampled, all rows of one address
//     together (the address's UDP canary serves them all). Each of the
//     three kinds gets a share of the free rows in proportion to its size,
//     its addresses are sorted, and the run probes the window of them
//     that [Spec].Rotation names; the next rotation takes the next window,
//     so consecutive runs cover every address ([Sampling].Runs of them);
//   - the rows left out are neither passed nor failed: they are not rows
//     of the result at all, and the result's [Sampling] says how many
//     there are, which addresses they aim at, and that the next run
//     covers others.

// DefaultBudget is the row budget of a plan without [Spec].Budget: at the
// probe's full concurrency, about 16 rounds of the per-probe timeout.
const DefaultBudget = 1024

// Sampling says what a sampled plan left out (see the comment above
// DefaultBudget).
type Sampling struct {
	// Budget is the plan's row budget.
	Budget int `json:"budget"`
	// Rotation picked this run's window of each sampled kind.
	Rotation uint64 `json:"rotation"`
	// Runs is how many consecutive rotations cover every sampled address.
	Runs int `json:"runs"`
	// Addresses is how many addresses were up for sampling; Probed how
	// many of them this run probes.
	Addresses int `json:"addresses"`
	Probed    int `json:"probed"`
	// RowsLeftOut is how many planned rows this run does not probe.
	RowsLeftOut int `json:"rows_left_out"`
	// LeftOut are the addresses not probed, as "group address".
	LeftOut []string `json:"left_out"`
}

// String is the report's line about the sample.
func (s *Sampling) String() string {
	return fmt.Sprintf("SAMPLED: %d rows to %d of %d addresses of other zones (gateways, guests) and the LAN are not probed in this run "+
		"and count neither as passed nor as failed; the next run probes others (rotation %d, every address within %d consecutive runs)",
		s.RowsLeftOut, s.Addresses-s.Probed, s.Addresses, s.Rotation, s.Runs)
}

// sampleUnit is one sampled address: the indices of its checks.
type sampleUnit struct {
	addr   netip.Addr
	checks []int
}

// sample cuts p's checks down to budget when they are over it (see the
// comment above DefaultBudget). Checks with a valid sample address are
// the sampled ones.
func (p *Plan) sample(budget int, rotation uint64) error {
	if budget <= 0 {
		budget = DefaultBudget
	}
	if len(p.Checks) <= budget {
		return nil
	}
	byGroup := map[Group]map[netip.Addr]*sampleUnit{}
	fixed := 0
	for i, c := range p.Checks {
		if !c.sample.IsValid() {
			fixed++
			continue
		}
		g := byGroup[c.Group]
		if g == nil {
			g = map[netip.Addr]*sampleUnit{}
			byGroup[c.Group] = g
		}
		u := g[c.sample]
		if u == nil {
			u = &sampleUnit{addr: c.sample}
			g[c.sample] = u
		}
		u.checks = append(u.checks, i)
	}
	if fixed > probe.MaxTargets {
		return fmt.Errorf("spec: %d rows about the node's own addresses and the fixed checks, over the probe's %d", fixed, probe.MaxTargets)
	}
	free := min(max(budget-fixed, budget/4), probe.MaxTargets-fixed)
	sampled := len(p.Checks) - fixed
	s := &Sampling{Budget: budget, Rotation: rotation, Runs: 1}
	keep := make([]bool, len(p.Checks))
	for _, g := range []Group{GroupControlPlane, GroupOtherZone, GroupLAN} {
		units := sortedUnits(byGroup[g])
		if len(units) == 0 {
			continue
		}
		rows, widest := 0, 0
		for _, u := range units {
			rows += len(u.checks)
			widest = max(widest, len(u.checks))
		}
		// this kind's share of the free rows, in whole addresses
		per := min(max(1, free*rows/sampled/widest), len(units))
		windows := (len(units) + per - 1) / per
		s.Runs = max(s.Runs, windows)
		start := int(rotation%uint64(windows)) * per
		s.Addresses += len(units)
		for k, u := range units {
			// the last window wraps around to the first addresses
			if (k-start+len(units))%len(units) < per {
				s.Probed++
				for _, i := range u.checks {
					keep[i] = true
				}
				continue
			}
			s.RowsLeftOut += len(u.checks)
			s.LeftOut = append(s.LeftOut, string(g)+" "+u.addr.String())
		}
	}
	if s.RowsLeftOut == 0 {
		return nil
	}
	out := p.Checks[:0]
	for i, c := range p.Checks {
		if keep[i] || !c.sample.IsValid() {
			out = append(out, c)
		}
	}
	p.Checks = out
	p.Sampling = s
	return nil
}

// sortedUnits returns the units in address order.
func sortedUnits(m map[netip.Addr]*sampleUnit) []*sampleUnit {
	out := make([]*sampleUnit, 0, len(m))
	for _, u := range m {
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b *sampleUnit) int { return a.addr.Compare(b.addr) })
	return out
}
