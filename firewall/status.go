package firewall

import (
	"context"
	"fmt"

	"github.com/google/nftables"
)

// Status is what `pve-inspectd status` reports: the table in force and how
// it differs from what the guard would apply now.
type Status struct {
	// Classification is the interface classification read now.
	Classification Classification
	// Present is false when the kernel has no table inet pve-inspect.
	Present bool
	// Owned: a live process holds the table (owner flag); Owner is its port.
	Owned bool
	Owner uint32
	// Persist: the table survives its owner.
	Persist bool
	// Switches are the lockdown and fail-closed states found in the kernel.
	Switches Switches
	// Desired is the ruleset the guard would keep in force with Switches.
	Desired *Ruleset
	// Drifts lists every difference; an orphaned table (no daemon holds it)
	// is one too.
	Drifts []Drift
	// Counters are the kernel counters of the table's rules.
	Counters []RuleCounter
	// Notes are facts that are not differences.
	Notes []string
	// Bridge is the layer-2 table bridge pve-inspect.
	Bridge TableStatus
}

// TableStatus is the state of one table in the kernel.
type TableStatus struct {
	Present, Owned, Persist bool
	Owner                   uint32
	// Desired is the ruleset the guard would keep in force. The port map
	// is run-time state of the daemon (SetPorts): set members found in the
	// kernel are reported in Notes, not as drift.
	Desired  *Ruleset
	Drifts   []Drift
	Counters []RuleCounter
	Notes    []string
}

// superset reports whether got holds every element of want, and how many
// more.
func superset(got, want []nftables.SetElement) (int, bool) {
	have := map[string]bool{}
	for _, k := range elemKeys(got) {
		have[k] = true
	}
	for _, k := range elemKeys(want) {
		if !have[k] {
			return 0, false
		}
	}
	return len(got) - len(want), true
}

// Inspect reads the kernel's table and compares it with the ruleset the
// guard would apply now: cfg with the run-time zones' egress policies
// WithEgress gives (the daemon's sandboxes', from its state file), as
// the running guard renders them. It changes nothing.
func Inspect(ctx context.Context, cfg Config, opts ...Option) (*Status, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o := buildOptions(opts)
	cfg = cfg.WithRunEgress(o.egress)
	cl, err := newClassifier(o.ns, cfg.Trusted)
	if err != nil {
		return nil, err
	}
	defer cl.close()
	cls, err := cl.classify()
	if err != nil {
		return nil, err
	}
	rd, err := openReader(o)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	k, err := readKernel(rd)
	if err != nil {
		return nil, err
	}
	st := &Status{Classification: cls, Present: k.table != nil}
	if k.table != nil {
		st.Owned = k.table.Flags&nftables.TableFlagOwner != 0
		st.Owner = k.table.Owner
		st.Persist = k.table.Flags&nftables.TableFlagPersist != 0
		st.Switches = Switches{Lockdown: len(k.elems[SetLockdown]) > 0, FailClosed: len(k.elems[SetFailClosed]) > 0}
	}
	st.Desired, err = Render(cfg, cls, st.Switches)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	st.Drifts = diff(st.Desired, k, 0)
	// Pairs the running daemon added for zones the sandbox API created
	// (SetZones) are not in the configuration: extra pairs are reported,
	// not counted as differences; missing configured pairs still are.
	kept := st.Drifts[:0]
	for _, d := range st.Drifts {
		if d.Kind == DriftElements && (d.Object == SetGuestAddrs4 || d.Object == SetGuestSelf4) {
			// the running daemon's port map, not configuration
			st.Notes = append(st.Notes, fmt.Sprintf("%s: %d guest address(es) from the port map", d.Object, len(k.elems[d.Object])))
			continue
		}
		if d.Kind == DriftElements && d.Object == SetZonePeers {
			if extra, ok := superset(k.elems[SetZonePeers], st.Desired.Set(SetZonePeers).Elements); ok {
				st.Notes = append(st.Notes, fmt.Sprintf("%d zone pair(s) added at run time (SetZones)", extra))
				continue
			}
		}
		kept = append(kept, d)
	}
	st.Drifts = kept
	if k.table != nil && !st.Owned {
		st.Drifts = append(st.Drifts, Drift{DriftTableOwner, "table", "orphaned: no running daemon holds it (still in force)"})
	}
	st.Counters, _, err = countersOf(k, st.Desired)
	if err != nil {
		return nil, err
	}
	if st.Bridge, err = inspectBridge(rd, cfg, cls); err != nil {
		return nil, err
	}
	// the arp table (arptable.go): its differences count with the inet
	// table's, named arp:...; its owner is the inet table's
	ak, err := readKernelTable(rd, nftables.TableFamilyARP)
	if err != nil {
		return nil, err
	}
	for _, d := range diff(RenderARP(cls), ak, 0) {
		if d.Kind == DriftTableOwner {
			continue
		}
		d.Object = "arp:" + d.Object
		st.Drifts = append(st.Drifts, d)
	}
	return st, nil
}

// inspectBridge reads table bridge pve-inspect and compares its chains,
// rules and set types with the desired ones.
func inspectBridge(rd *tableReader, cfg Config, cls Classification) (TableStatus, error) {
	k, err := readKernelTable(rd, nftables.TableFamilyBridge)
	if err != nil {
		return TableStatus{}, err
	}
	var ts TableStatus
	if k.table != nil {
		ts.Present = true
		ts.Owned = k.table.Flags&nftables.TableFlagOwner != 0
		ts.Owner = k.table.Owner
		ts.Persist = k.table.Flags&nftables.TableFlagPersist != 0
	}
	ts.Desired, err = RenderBridge(zoneBridges(cfg), cls, nil, cfg.Flood)
	if err != nil {
		return TableStatus{}, fmt.Errorf("render bridge table: %w", err)
	}
	for _, d := range diff(ts.Desired, k, 0) {
		if d.Kind == DriftElements {
			continue
		}
		ts.Drifts = append(ts.Drifts, d)
	}
	if k.table != nil {
		ts.Notes = append(ts.Notes, fmt.Sprintf("%d guest port(s), %d mapped (MAC), %d address(es) pinned",
			len(k.elems[SetGuestPorts]), len(k.elems[SetPorts]), len(k.elems[SetPortIPv4])))
		if !ts.Owned {
			ts.Drifts = append(ts.Drifts, Drift{DriftTableOwner, "table", "orphaned: no running daemon holds it (still in force)"})
		}
	}
	ts.Counters, _, err = countersOf(k, ts.Desired)
	if err != nil {
		return TableStatus{}, err
	}
	return ts, nil
}
