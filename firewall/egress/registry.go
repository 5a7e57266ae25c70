package egress

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// Guard is what the egress parts need from the host guard
// (*firewall.Guard).
type Guard interface {
	SetEgress(ctx context.Context, policies map[string]firewall.ZoneEgress) error
	EgressOf(iface string) (firewall.ZoneEgress, bool)
	Learn(ctx context.Context, iface string, addrs []netip.Addr, ttl time.Duration) ([]netip.Addr, error)
	Forget(ctx context.Context, ifaces []string) error
}

// NodeOwner is the owner label of interfaces under the node-wide default.
const NodeOwner = "node-default"

// Registry holds the egress rules of every zone with a policy of its own
// (the daemon's sandboxes) and the node-wide default, and keeps the
// guard's sets equal to them. The resolver and the proxy look rules up by
// the guest's incoming interface.
type Registry struct {
	guard Guard
	def   Rules
	state *State // persists zones; nil: nothing persisted

	mu    sync.Mutex // guards zones; held across the guard and file writes so they apply in order
	zones map[string]zoneEntry
}

type zoneEntry struct {
	owner   string
	bridges []string
	rules   Rules
}

// NewRegistry returns a registry applying to g, with def for every
// interface whose zone has no policy. st (may be nil) holds the policies
// persisted by the last run, already in force through firewall.WithEgress;
// every change is written back to it.
func NewRegistry(g Guard, def Rules, st *State) *Registry {
	r := &Registry{guard: g, def: def, state: st, zones: map[string]zoneEntry{}}
	if st != nil {
		r.zones = maps.Clone(st.zones)
	}
	return r
}

// Set gives zone (owned by owner, e.g. the sandbox id, with its vnet
// bridges) its rules. The kernel holds them when Set returns; addresses
// learned under the previous rules are forgotten. On error nothing
// changes.
func (r *Registry) Set(ctx context.Context, zone, owner string, bridges []string, rules Rules) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := maps.Clone(r.zones)
	prev, had := next[zone]
	next[zone] = zoneEntry{owner: owner, bridges: slices.Clone(bridges), rules: rules}
	if err := r.apply(ctx, next); err != nil {
		return fmt.Errorf("egress of %s: %w", owner, err)
	}
	r.zones = next
	if err := r.state.save(next); err != nil {
		return fmt.Errorf("egress of %s: in force, but not persisted: %w", owner, err)
	}
	forget := slices.Clone(bridges)
	if had {
		forget = append(forget, prev.bridges...)
	}
	if err := r.guard.Forget(ctx, forget); err != nil {
		return fmt.Errorf("egress of %s: %w", owner, err)
	}
	return nil
}

// Remove drops zone's own rules (its sandbox is gone).
func (r *Registry) Remove(ctx context.Context, zone string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.zones[zone]
	if !ok {
		return nil
	}
	next := maps.Clone(r.zones)
	delete(next, zone)
	if err := r.apply(ctx, next); err != nil {
		return fmt.Errorf("remove egress of zone %s: %w", zone, err)
	}
	r.zones = next
	if err := r.state.save(next); err != nil {
		return fmt.Errorf("remove egress of zone %s: %w", zone, err)
	}
	return r.guard.Forget(ctx, e.bridges)
}

func (r *Registry) apply(ctx context.Context, zones map[string]zoneEntry) error {
	return r.guard.SetEgress(ctx, kernelZones(zones))
}

// Owner returns the owner of zone's own policy.
func (r *Registry) Owner(zone string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.zones[zone]
	return e.owner, ok
}

// Get returns the rules of zone and whether it has its own.
func (r *Registry) Get(zone string) (Rules, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.zones[zone]
	return e.rules, ok
}

// Default returns the node-wide default rules.
func (r *Registry) Default() Rules { return r.def }

// ErrNotGuest is returned for an interface that is not a guest's.
var ErrNotGuest = errors.New("not a guest interface")

// For returns the rules in force for guest interface iface and their
// owner; interfaces of no zone with a policy get the default (owner
// NodeOwner). Management, trusted and lo interfaces get ErrNotGuest.
func (r *Registry) For(iface string) (Rules, string, error) {
	if _, ok := r.guard.EgressOf(iface); !ok {
		return Rules{}, "", fmt.Errorf("%s: %w", iface, ErrNotGuest)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.zones {
		if slices.Contains(e.bridges, iface) {
			return e.rules, e.owner, nil
		}
	}
	return r.def, NodeOwner, nil
}
