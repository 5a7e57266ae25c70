package egress

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
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
	LearnOpen(ctx context.Context, iface string, addrs []netip.Addr, open firewall.Opening, ttl time.Duration) ([]netip.Addr, error)
	Forget(ctx context.Context, ifaces []string) error
	ForgetExcept(ctx context.Context, keep []string) error
}

// NodeOwner is the owner label of interfaces under the node-wide default.
const NodeOwner = "node-default"

// DefaultMaxLearned is the default cap on the addresses one owner (a
// sandbox, or the node default) has open at once.
const DefaultMaxLearned = 1024

// ErrStale is returned by Learn for an answer to a query asked under a
// policy that has changed since: what it resolved is not opened.
var ErrStale = errors.New("policy changed since the query")

// ErrQuota is returned by Learn when the owner's learned addresses are
// at their cap.
var ErrQuota = errors.New("learned-address quota reached")

// Registry holds the egress rules of every zone with a policy of its own
// (the daemon's sandboxes) and the node-wide default, and keeps the
// guard's sets equal to them. The resolver and the proxy look rules up by
// the guest's incoming interface.
//
// Every change of an interface's policy starts a new generation of it:
// an answer to a query asked under an older generation is not learned,
// the learned addresses of the old policy are forgotten and the proxy's
// connections from the interface are closed (OnChange), all before Set
// returns and under one lock, so nothing the old policy let through
// survives the change.
type Registry struct {
	guard      Guard
	def        Rules
	state      *State // persists zones; nil: nothing persisted
	maxLearned int

	mu      sync.Mutex // guards the fields below; held across the guard and file writes so they apply in order
	zones   map[string]zoneEntry
	seq     uint64
	gen     map[string]uint64                   // guest interface -> generation of its policy
	learned map[string]map[netip.Addr]time.Time // guest interface -> learned address -> expiry
	cuts    []func(ifaces []string)
}

type zoneEntry struct {
	owner   string
	bridges []string
	rules   Rules
}

// RegistryOption configures a Registry.
type RegistryOption func(*Registry)

// WithMaxLearned caps the addresses one owner has open at once (zero:
// DefaultMaxLearned); a learn past it opens nothing and is refused with
// ErrQuota.
func WithMaxLearned(n int) RegistryOption {
	return func(r *Registry) {
		if n > 0 {
			r.maxLearned = n
		}
	}
}

// NewRegistry returns a registry applying to g, with def for every
// interface whose zone has no policy. st (may be nil) holds the policies
// persisted by the last run, already in force through firewall.WithEgress;
// every change is written back to it.
func NewRegistry(g Guard, def Rules, st *State, opts ...RegistryOption) *Registry {
	r := &Registry{guard: g, def: def, state: st, maxLearned: DefaultMaxLearned, zones: map[string]zoneEntry{},
		gen: map[string]uint64{}, learned: map[string]map[netip.Addr]time.Time{}}
	if st != nil {
		r.zones = maps.Clone(st.zones)
	}
	for _, o := range opts {
		o(r)
	}
	return r
}

// OnChange registers fn to be called with the interfaces whose policy
// changed, after the kernel holds the new one and before Set or Remove
// returns (the proxy closes their connections). fn must not call back
// into the registry.
func (r *Registry) OnChange(fn func(ifaces []string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cuts = append(r.cuts, fn)
}

// Set gives zone (owned by owner, e.g. the sandbox id, with its vnet
// bridges) its rules. The kernel holds them when Set returns; addresses
// learned under the previous rules are forgotten and connections the
// proxy spliced under them closed. If the kernel refuses the rules
// nothing changes; an error after that (forgetting, persisting) is
// returned with the rules in force.
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
	changed := slices.Clone(bridges)
	if had {
		changed = append(changed, prev.bridges...)
	}
	if err := r.changedLocked(ctx, changed); err != nil {
		return fmt.Errorf("egress of %s: in force, but %w", owner, err)
	}
	return nil
}

// changedLocked ends the old policy of ifaces once the kernel holds the
// new one: a new generation (no answer in flight is learned), the proxy's
// connections closed, the learned addresses forgotten, the zones
// persisted. Every step runs even if one before failed (and even if ctx
// is cancelled: the new policy is in force already); the errors are
// joined.
func (r *Registry) changedLocked(ctx context.Context, ifaces []string) error {
	ctx = context.WithoutCancel(ctx)
	r.seq++
	for _, n := range ifaces {
		r.gen[n] = r.seq
		delete(r.learned, n)
	}
	for _, cut := range r.cuts {
		cut(ifaces)
	}
	var errs []error
	if err := r.guard.Forget(ctx, ifaces); err != nil {
		errs = append(errs, fmt.Errorf("forgetting the old policy's addresses: %w", err))
	}
	if err := r.state.save(r.zones, r.def); err != nil {
		errs = append(errs, fmt.Errorf("not persisted: %w", err))
	}
	return errors.Join(errs...)
}

// Reconcile brings what the kernel learned before this start in line with
// the policies now in force (call it once, before serving): a zone whose
// persisted policy is an allow-list keeps its learned addresses (the
// guests cached those answers); every other interface's are forgotten,
// and the node default's too unless it is the same allow-list the last
// run persisted (a changed [egress] default must not keep what the old
// one opened). It records the default in the state file.
func (r *Registry) Reconcile(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var keep, gone []string
	for _, e := range r.zones {
		if e.rules.Mode == firewall.EgressAllowlist {
			keep = append(keep, e.bridges...)
		} else {
			gone = append(gone, e.bridges...)
		}
	}
	var err error
	if r.def.Mode == firewall.EgressAllowlist && r.state != nil && r.state.def != nil && reflect.DeepEqual(*r.state.def, r.def.Policy()) {
		err = r.guard.Forget(ctx, gone)
	} else {
		err = r.guard.ForgetExcept(ctx, keep)
	}
	if err != nil {
		return fmt.Errorf("egress: reconcile learned addresses: %w", err)
	}
	if err := r.state.save(r.zones, r.def); err != nil {
		return fmt.Errorf("egress: reconcile: %w", err)
	}
	return nil
}

// Learn opens addrs for iface as open says, for ttl, if iface's policy is
// still generation gen (the one the query was answered under) and the
// owner's learned addresses stay within the cap; it returns the addresses
// the guard skipped. A change of the policy cannot interleave: Set holds
// the same lock from the kernel change to the forgetting.
func (r *Registry) Learn(ctx context.Context, iface string, gen uint64, addrs []netip.Addr, open firewall.Opening, ttl time.Duration) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen[iface] != gen {
		return nil, fmt.Errorf("learn for %s: %w", iface, ErrStale)
	}
	now := time.Now()
	owner := r.ownerLocked(iface)
	have := 0
	for n, m := range r.learned {
		if r.ownerLocked(n) != owner {
			continue
		}
		maps.DeleteFunc(m, func(_ netip.Addr, exp time.Time) bool { return !exp.After(now) })
		have += len(m)
	}
	mine := r.learned[iface]
	fresh := 0
	for _, a := range addrs {
		if _, ok := mine[a]; !ok {
			fresh++
		}
	}
	if have+fresh > r.maxLearned {
		return nil, fmt.Errorf("learn for %s: %d addresses open, cap %d: %w", owner, have, r.maxLearned, ErrQuota)
	}
	skipped, err := r.guard.LearnOpen(ctx, iface, addrs, open, ttl)
	if err != nil {
		return nil, err
	}
	if mine == nil {
		mine = map[netip.Addr]time.Time{}
		r.learned[iface] = mine
	}
	for _, a := range addrs {
		if !slices.Contains(skipped, a) {
			mine[a] = now.Add(ttl)
		}
	}
	return skipped, nil
}

// Current reports whether iface's policy is still generation gen.
func (r *Registry) Current(iface string, gen uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gen[iface] == gen
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
	if err := r.changedLocked(ctx, e.bridges); err != nil {
		return fmt.Errorf("remove egress of zone %s: removed, but %w", zone, err)
	}
	return nil
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
	rules, owner, _, err := r.ForGen(iface)
	return rules, owner, err
}

// ForGen is For with the generation of the interface's policy (for Learn
// and Current).
func (r *Registry) ForGen(iface string) (Rules, string, uint64, error) {
	if _, ok := r.guard.EgressOf(iface); !ok {
		return Rules{}, "", 0, fmt.Errorf("%s: %w", iface, ErrNotGuest)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.zones {
		if slices.Contains(e.bridges, iface) {
			return e.rules, e.owner, r.gen[iface], nil
		}
	}
	return r.def, NodeOwner, r.gen[iface], nil
}

// ZoneOf returns the zone whose own policy covers iface (none for an
// interface under the node default).
func (r *Registry) ZoneOf(iface string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, e := range r.zones {
		if slices.Contains(e.bridges, iface) {
			return id, true
		}
	}
	return "", false
}

func (r *Registry) ownerLocked(iface string) string {
	for _, e := range r.zones {
		if slices.Contains(e.bridges, iface) {
			return e.owner
		}
	}
	return NodeOwner
}
