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
	// LearnedElements lists the learned sets as the kernel holds them.
	LearnedElements(ctx context.Context) ([]firewall.LearnedElement, error)
	// ZoneOfBridge names the zone (configured or run-time) whose bridge
	// iface is.
	ZoneOfBridge(iface string) (string, bool)
}

// DefaultOwnerOf is the owner of a guest interface under the node-wide
// default (a zone the daemon did not create): every such zone is an owner
// of its own, "zone:<id>", and an interface of no known zone is one too,
// "iface:<name>", so that no two of them share one quota.
func DefaultOwnerOf(zone, iface string) string {
	if zone != "" {
		return "zone:" + zone
	}
	return "iface:" + iface
}

// DefaultMaxLearned is the default cap on the learned-set elements one
// owner has at once.
const DefaultMaxLearned = 1024

// ErrStale is returned by Learn for an answer to a query asked under a
// policy that has changed since: what it resolved is not opened.
var ErrStale = errors.New("policy changed since the query")

// ErrQuota is returned by Learn when the owner's learned-set elements
// are at their cap (or all owners' at the node total); errors.As to a
// *QuotaError says which.
var ErrQuota = errors.New("learned-address quota reached")

// QuotaError is Learn's refusal past a quota.
type QuotaError struct {
	Owner string
	// Limit is LimitOwner (the owner's cap) or LimitNode (the node
	// total: the kernel's learned set).
	Limit     string
	Have, Cap int
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("learn for %s: %d learned-set elements of %s, cap %d: %v", e.Owner, e.Have, e.Limit, e.Cap, ErrQuota)
}

// Is makes errors.Is(err, ErrQuota) true.
func (e *QuotaError) Is(target error) bool { return target == ErrQuota }

// Registry holds the egress rules of every zone with a policy of its own
// (the daemon's sandboxes) and the node-wide default, and keeps the
// guard's sets equal to them. The resolver and the proxy look rules up by
// the guest's incoming interface.
//
// What it keeps of an interface (its generation, its learned-set
// elements) is dropped on every change of the interface's policy, and so
// at the end of each instance of its zone: Remove (the sandbox deleted),
// Begin (the same zone handed to a new tenant, a pool member claimed).
// The records kept elsewhere of the zone's owner (denials, counter
// series) are dropped by the OnDrop callbacks at the same two points, as
// are the zone's VM names (SetNames), which a Set handing the zone to
// another owner drops too.
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
	gen     map[string]uint64          // guest interface -> generation of its policy
	began   map[string]uint64          // guest interface of a zone's own policy -> the generation its instance began at
	learned map[string]*learnedSet     // guest interface -> its learned-set elements
	names   map[string]vmNames         // zone -> its instance's VM names (SetNames); dropped with the instance
	cuts    []func(ifaces []string)    // OnChange
	drops   []func(zone, owner string) // OnDrop
}

// element is one member of the guard's learned sets for an interface:
// port 0 is the address in @egress_learned4 (tcp 80/443 through the name
// check), any other port the address and port in @egress_learned_ports4
// (a name:port entry). They are what the kernel counts against the sets'
// size, so they are what the quota counts.
type element struct {
	addr netip.Addr
	port uint16
}

// learnedSet is what an interface has learned: its elements with their
// expiry, and the owner they count against.
type learnedSet struct {
	owner string
	els   map[element]time.Time
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
		gen: map[string]uint64{}, began: map[string]uint64{}, learned: map[string]*learnedSet{},
		names: map[string]vmNames{}}
	if st != nil {
		r.zones = maps.Clone(st.zones)
		// The persisted zones' instances began before this start: the
		// first generation, which every Seq read after it is at least,
		// so that their drops since the first read are theirs, across
		// their first policy change too.
		r.seq = 1
		for _, e := range r.zones {
			for _, b := range e.bridges {
				r.began[b] = 1
			}
		}
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

// OnDrop registers fn to be called with a zone and its owner whose
// instance ended (Remove, Begin), before they return: what is kept of
// them elsewhere (Denials.Forget, LeaseNames.Forget) goes with it. fn
// must not call back into the registry.
func (r *Registry) OnDrop(fn func(zone, owner string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drops = append(r.drops, fn)
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
	return r.setLocked(ctx, zone, owner, bridges, rules)
}

// Begin is Set for a new instance of zone (the same zone and owner handed
// to another tenant: a pool member claimed). Besides what Set ends, every
// record of the old instance is dropped (OnDrop) under the same lock, so
// that a denial decided under the old policy (Registry.IfCurrent) is
// never recorded for the new one.
func (r *Registry) Begin(ctx context.Context, zone, owner string, bridges []string, rules Rules) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.setLocked(ctx, zone, owner, bridges, rules)
	if errors.Is(err, errNotInForce) {
		return err
	}
	for _, n := range bridges {
		r.began[n] = r.seq
	}
	delete(r.names, zone)
	r.dropLocked(zone, owner)
	return err
}

// ZonesGone tells the registry that zones are gone from the node (the
// guard's zones changed): a zone without a policy of its own is an owner
// of its own (DefaultOwnerOf), and what is kept of it goes with it
// (OnDrop). A zone with its own policy ends with Remove instead.
func (r *Registry) ZonesGone(zones []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range zones {
		if _, own := r.zones[id]; !own {
			r.dropLocked(id, DefaultOwnerOf(id, ""))
		}
	}
}

func (r *Registry) dropLocked(zone, owner string) {
	for _, fn := range r.drops {
		fn(zone, owner)
	}
}

// errNotInForce marks a Set the kernel refused (nothing changed).
var errNotInForce = errors.New("not in force")

func (r *Registry) setLocked(ctx context.Context, zone, owner string, bridges []string, rules Rules) error {
	next := maps.Clone(r.zones)
	prev, had := next[zone]
	next[zone] = zoneEntry{owner: owner, bridges: slices.Clone(bridges), rules: rules}
	if err := r.apply(ctx, next); err != nil {
		return fmt.Errorf("egress of %s: %w: %w", owner, errNotInForce, err)
	}
	r.zones = next
	if had && prev.owner != owner {
		delete(r.names, zone) // another owner's: not its names
	}
	changed := slices.Clone(bridges)
	if had {
		changed = append(changed, prev.bridges...)
	}
	err := r.changedLocked(ctx, changed)
	for _, n := range changed {
		switch kept := had && prev.owner == owner && slices.Contains(prev.bridges, n); {
		case !slices.Contains(bridges, n):
			delete(r.began, n) // back under the node default
		case !kept || r.began[n] == 0:
			r.began[n] = r.seq
		}
	}
	if err != nil {
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
// one opened). What is kept counts against its owner again, with the
// expiry the kernel reports, so that a restart never gives an owner
// another max_learned on top. It records the default in the state file.
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
	kept, err := r.guard.LearnedElements(ctx)
	if err != nil {
		return fmt.Errorf("egress: reconcile learned addresses: %w", err)
	}
	r.countKeptLocked(kept, time.Now())
	if err := r.state.save(r.zones, r.def); err != nil {
		return fmt.Errorf("egress: reconcile: %w", err)
	}
	return nil
}

// Learn opens addrs for iface as open says, for ttl, if iface's policy is
// still generation gen (the one the query was answered under) and the
// learned-set elements stay within the owner's cap and the node total
// (the size of the kernel's sets); it returns the addresses the guard
// skipped. The elements are counted as the kernel counts them: an address
// opened through the name check is one, each port of a name:port entry
// one more. A change of the policy cannot interleave: Set holds the same
// lock from the kernel change to the forgetting.
func (r *Registry) Learn(ctx context.Context, iface string, gen uint64, addrs []netip.Addr, open firewall.Opening, ttl time.Duration) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen[iface] != gen {
		return nil, fmt.Errorf("learn for %s: %w", iface, ErrStale)
	}
	now := time.Now()
	owner := r.ownerLocked(iface)
	els := elements(addrs, open)
	have, all := r.countLocked(owner, now)
	mine := r.learned[iface]
	fresh := 0
	for _, e := range els {
		if mine == nil || !mine.has(e) {
			fresh++
		}
	}
	if have+fresh > r.maxLearned {
		return nil, &QuotaError{Owner: owner, Limit: LimitOwner, Have: have, Cap: r.maxLearned}
	}
	if all+fresh > firewall.EgressLearnedSize {
		return nil, &QuotaError{Owner: owner, Limit: LimitNode, Have: all, Cap: firewall.EgressLearnedSize}
	}
	skipped, err := r.guard.LearnOpen(ctx, iface, addrs, open, ttl)
	if err != nil {
		return nil, err
	}
	if mine == nil || mine.owner != owner {
		mine = &learnedSet{owner: owner, els: map[element]time.Time{}}
		r.learned[iface] = mine
	}
	for _, e := range els {
		if !slices.Contains(skipped, e.addr) {
			mine.els[e] = now.Add(ttl)
		}
	}
	return skipped, nil
}

// countKeptLocked counts the elements the kernel kept across a restart
// against their interfaces' owners, as Learn would have.
func (r *Registry) countKeptLocked(kept []firewall.LearnedElement, now time.Time) {
	for _, k := range kept {
		l := r.learned[k.Iface]
		if l == nil {
			l = &learnedSet{owner: r.ownerLocked(k.Iface), els: map[element]time.Time{}}
			r.learned[k.Iface] = l
		}
		l.els[element{addr: k.Addr, port: k.Port}] = now.Add(k.Expires)
	}
}

// elements are the learned-set elements open makes of addrs.
func elements(addrs []netip.Addr, open firewall.Opening) []element {
	var out []element
	for _, a := range addrs {
		if open.Checked {
			out = append(out, element{addr: a})
		}
		for _, p := range open.Ports {
			out = append(out, element{addr: a, port: p})
		}
	}
	return out
}

func (l *learnedSet) has(e element) bool {
	_, ok := l.els[e]
	return ok
}

// countLocked drops the expired elements and returns how many owner has
// and how many all interfaces have.
func (r *Registry) countLocked(owner string, now time.Time) (mine, all int) {
	for n, l := range r.learned {
		maps.DeleteFunc(l.els, func(_ element, exp time.Time) bool { return !exp.After(now) })
		if len(l.els) == 0 {
			delete(r.learned, n)
			continue
		}
		all += len(l.els)
		if l.owner == owner {
			mine += len(l.els)
		}
	}
	return mine, all
}

// Learned returns the learned-set elements owner has now (as the kernel
// counts them).
func (r *Registry) Learned(owner string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	mine, _ := r.countLocked(owner, time.Now())
	return mine
}

// Seq is a number that changes with every change of a policy (Set,
// Begin, Remove): what was looked up under the same Seq still holds. The
// generation a change gives its interfaces (ForGen) is its Seq, so a
// generation no larger than a Seq read earlier was in force then.
func (r *Registry) Seq() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq
}

// Current reports whether iface's policy is still generation gen.
func (r *Registry) Current(iface string, gen uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gen[iface] == gen
}

// IfCurrent runs fn if iface's policy is still generation gen, under the
// registry's lock (so no change, and no Begin dropping the owner's
// records, interleaves): a denial decided under an old policy is recorded
// with fn only while that policy is in force. fn must be quick and must
// not call back into the registry.
func (r *Registry) IfCurrent(iface string, gen uint64, fn func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen[iface] != gen {
		return false
	}
	fn()
	return true
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
	err := r.changedLocked(ctx, e.bridges)
	// The generation changedLocked just gave them already refuses every
	// answer in flight; a bridge no zone holds reads generation 0, which
	// no answer asked under the removed zone carries, so the entries go
	// with the zone (nothing is kept per bridge name ever seen).
	for _, n := range e.bridges {
		delete(r.gen, n)
		delete(r.began, n)
	}
	delete(r.names, zone)
	r.dropLocked(zone, e.owner)
	if err != nil {
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

// BridgesOf returns the bridges of the policies owner's zones have
// (a sandbox's: its networks).
func (r *Registry) BridgesOf(owner string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.zones {
		if e.owner == owner {
			out = append(out, e.bridges...)
		}
	}
	return out
}

// Default returns the node-wide default rules.
func (r *Registry) Default() Rules { return r.def }

// ErrNotGuest is returned for an interface that is not a guest's.
var ErrNotGuest = errors.New("not a guest interface")

// For returns the rules in force for guest interface iface and their
// owner; interfaces of no zone with a policy get the default, each zone
// of them an owner of its own (DefaultOwnerOf). Management, trusted and
// lo interfaces get ErrNotGuest.
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
	return r.def, r.defaultOwnerLocked(iface), r.gen[iface], nil
}

// forAnswer is ForGen with, read under the same lock, the generation
// iface's instance began at (ForInstance): a question is decided under
// the policy of gen and recorded for the instance of began.
func (r *Registry) forAnswer(iface string) (rules Rules, owner string, gen, began uint64, err error) {
	if _, ok := r.guard.EgressOf(iface); !ok {
		return Rules{}, "", 0, 0, fmt.Errorf("%s: %w", iface, ErrNotGuest)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.zones {
		if slices.Contains(e.bridges, iface) {
			return e.rules, e.owner, r.gen[iface], r.began[iface], nil
		}
	}
	return r.def, r.defaultOwnerLocked(iface), r.gen[iface], r.began[iface], nil
}

// ForInstance is ForGen with the generation iface's instance began at:
// the Set that gave the interface to its zone's owner, or the Begin that
// handed it to a new tenant (a policy change of the same owner keeps
// it). Zero for an interface under the node default, which has no
// instance of its own. A began no larger than a Seq read earlier means
// everything since then was that instance's.
func (r *Registry) ForInstance(iface string) (owner string, gen, began uint64, err error) {
	if _, ok := r.guard.EgressOf(iface); !ok {
		return "", 0, 0, fmt.Errorf("%s: %w", iface, ErrNotGuest)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ownerLocked(iface), r.gen[iface], r.began[iface], nil
}

// IfInstance runs fn, under the registry's lock like IfCurrent, if
// iface's instance is still the one begun at generation began (non-zero,
// from ForInstance), whatever policy changes it had since.
func (r *Registry) IfInstance(iface string, began uint64, fn func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if began == 0 || r.began[iface] != began {
		return false
	}
	fn()
	return true
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
	return r.defaultOwnerLocked(iface)
}

// defaultOwnerLocked is the owner of iface under the default (the guard's
// lock is taken inside the registry's, as in Set).
func (r *Registry) defaultOwnerLocked(iface string) string {
	zone, _ := r.guard.ZoneOfBridge(iface)
	return DefaultOwnerOf(zone, iface)
}
