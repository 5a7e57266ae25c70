package sandbox_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/miekg/dns"

	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/firewall/egress/egresstest"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// resolverEgress is sandbox.Egress over a real egress.Registry and
// Resolver, as the daemon's Egress wires them (Start and Claim begin an
// instance, SetNames hands the names over): the DNS a guest of a zone
// would ask is asked with Resolver.Answer on its bridge.
type resolverEgress struct {
	mu    sync.Mutex
	reg   *egress.Registry
	res   *egress.Resolver
	zones map[string]zoneOf // zone -> its sandbox and bridges (for restart)
	fail  error             // SetNames fails with it
	named []string          // the sandboxes SetNames was called for, in order
	order []string          // "claim:<id>" and "names:<id>", in order
}

type zoneOf struct {
	owner   string
	bridges []string
	p       apitype.EgressPolicy
}

func newResolverEgress() *resolverEgress {
	r := &resolverEgress{zones: map[string]zoneOf{}}
	r.fresh()
	return r
}

// fresh gives r a new registry and resolver holding the zones' policies
// and nothing else (a daemon restart: the persisted policies, no names).
func (r *resolverEgress) fresh() {
	def, _ := egress.Compile(egress.Policy{Mode: "none"})
	r.reg = egress.NewRegistry(egresstest.NopGuard{}, def, nil)
	r.res = egress.NewResolver(egress.ResolverConfig{Domain: func(z string) string { return z + ".lab" }},
		r.reg, nil, egress.NewDenials(), nil, slog.New(slog.DiscardHandler))
	for z, e := range r.zones {
		rules, _ := egress.Compile(egress.Policy{Mode: e.p.Mode})
		_ = r.reg.Begin(context.Background(), z, e.owner, e.bridges, rules)
	}
}

func (r *resolverEgress) Validate(p apitype.EgressPolicy) error {
	_, err := egress.Compile(egress.Policy{Mode: p.Mode, Allow: p.Allow, Deny: p.Deny})
	return err
}

func (r *resolverEgress) put(ctx context.Context, begin bool, sb, zone string, bridges []string, p apitype.EgressPolicy) error {
	rules, err := egress.Compile(egress.Policy{Mode: p.Mode, Allow: p.Allow, Deny: p.Deny})
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.zones[zone] = zoneOf{owner: sb, bridges: slices.Clone(bridges), p: p}
	if begin {
		return r.reg.Begin(ctx, zone, sb, bridges, rules)
	}
	return r.reg.Set(ctx, zone, sb, bridges, rules)
}

func (r *resolverEgress) Set(ctx context.Context, sb, zone string, bridges []string, p apitype.EgressPolicy) error {
	return r.put(ctx, false, sb, zone, bridges, p)
}

func (r *resolverEgress) Start(ctx context.Context, sb, zone string, bridges []string, p apitype.EgressPolicy) error {
	return r.put(ctx, true, sb, zone, bridges, p)
}

func (r *resolverEgress) Claim(ctx context.Context, sb, zone string, bridges []string, p apitype.EgressPolicy) error {
	r.mu.Lock()
	r.order = append(r.order, "claim:"+sb)
	r.mu.Unlock()
	return r.put(ctx, true, sb, zone, bridges, p)
}

func (r *resolverEgress) Remove(ctx context.Context, _, zone string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.zones, zone)
	return r.reg.Remove(ctx, zone)
}

func (r *resolverEgress) Status(sb, zone string) apitype.EgressStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return apitype.EgressStatus{Sandbox: sb, Policy: r.zones[zone].p}
}

func (r *resolverEgress) SetNames(_ context.Context, sb, zone string, names map[string][]sandbox.NameAddr) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.named = append(r.named, sb)
	r.order = append(r.order, "names:"+sb)
	if r.fail != nil {
		return r.fail
	}
	out := map[string][]egress.NameAddr{}
	for n, as := range names {
		out[n] = []egress.NameAddr{}
		for _, a := range as {
			out[n] = append(out[n], egress.NameAddr{Bridge: a.Bridge, Addr: a.Addr})
		}
	}
	return r.reg.SetNames(zone, sb, out)
}

var (
	_ sandbox.EgressNamer   = (*resolverEgress)(nil)
	_ sandbox.EgressClaimer = (*resolverEgress)(nil)
	_ sandbox.EgressStarter = (*resolverEgress)(nil)
)

// lookup asks name (A) as a guest on bridge and returns the addresses of
// an authoritative answer (nil for none: the name is no VM of the
// bridge's sandbox).
func (r *resolverEgress) lookup(t *testing.T, bridge, name string) []string {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	res := r.res
	r.mu.Unlock()
	var m dns.Msg
	if err := m.Unpack(res.Answer(context.Background(), bridge, b, 512)); err != nil {
		t.Fatal(err)
	}
	if !m.Authoritative {
		return nil
	}
	out := []string{}
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return out
}

// TestNamesInResolver: the engine hands each sandbox's VM names and IPAM
// addresses to the egress resolver wherever it names the guests: two
// sandboxes with the same names (open, none) each resolve their own
// siblings and themselves, bare and under the zone's domain, at the
// address the API reports, and never the other's; a deleted sandbox's
// names are gone; a warm pool member answers no name until it is
// claimed, then the claimer's (handed over after the claim's new
// instance began); a restart of the daemon (a resolver with no names)
// gets them back from the engine's start; a create whose names cannot be
// handed over fails.
func TestNamesInResolver(t *testing.T) {
	ctx := context.Background()
	eg := newResolverEgress()
	b := newPoolBed(t, []sandbox.PoolShape{small(1)}, func(o *sandbox.Options) { o.Egress = eg })
	two := func(mode string) apitype.CreateRequest {
		r := oneVM("debian")
		r.VMs = append(r.VMs, r.VMs[0])
		r.VMs[0].Name, r.VMs[1].Name = "attacker", "target"
		r.Egress = &apitype.EgressPolicy{Mode: mode}
		return r
	}
	a, err := b.e.Create(ctx, two("open"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := b.e.Create(ctx, two("none"))
	if err != nil {
		t.Fatal(err)
	}
	resolves := func(sb apitype.Sandbox, when string) {
		t.Helper()
		bridge := sb.Networks[0].VNet
		for _, v := range sb.VMs {
			want := []string{v.Addresses[0].IPv4}
			for _, n := range []string{v.Name, v.Name + "." + sb.Zone + ".lab"} {
				if got := eg.lookup(t, bridge, n); !slices.Equal(got, want) {
					t.Errorf("%s: %s on %s's bridge: %v, want %v (the API's)", when, n, sb.ID, got, want)
				}
			}
		}
	}
	resolves(a, "created")
	resolves(c, "created")
	if a.VMs[1].Addresses[0] == c.VMs[1].Addresses[0] {
		t.Fatalf("both sandboxes' target at %v: the test cannot tell them apart", a.VMs[1].Addresses)
	}
	// the other sandbox's zone domain is not a's
	if got := eg.lookup(t, a.Networks[0].VNet, "target."+c.Zone+".lab"); got != nil {
		t.Errorf("a asked target under c's domain: %v", got)
	}

	// the member: no names while it waits; the claimer's after the claim
	b.e.MaintainPool(ctx)
	members := b.e.Pool().Members
	if len(members) != 1 {
		t.Fatalf("members %+v", members)
	}
	eg.mu.Lock()
	named := slices.Clone(eg.named)
	eg.mu.Unlock()
	if !slices.Equal(named, []string{a.ID, c.ID}) {
		t.Errorf("names handed over for %v before the claim, want only the two creates'", named)
	}
	req := oneVMSized("debian", 1, 512)
	req.VMs[0].Name = "web"
	w, err := b.e.Create(ctx, req)
	if err != nil || !w.FromPool {
		t.Fatalf("claim: %+v %v", w, err)
	}
	resolves(w, "claimed")
	for _, n := range []string{"attacker", "target", "vm0"} {
		if got := eg.lookup(t, w.Networks[0].VNet, n); got != nil {
			t.Errorf("the claimed sandbox resolves %s: %v", n, got)
		}
	}
	eg.mu.Lock()
	order := slices.Clone(eg.order)
	eg.mu.Unlock()
	if i, j := slices.Index(order, "claim:"+w.ID), slices.Index(order, "names:"+w.ID); i < 0 || j < i {
		t.Errorf("claim and names in order %v, want the claim's instance begun before its names", order)
	}

	// a delete drops them
	if err := b.e.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"attacker", "target"} {
		if got := eg.lookup(t, a.Networks[0].VNet, n); got != nil {
			t.Errorf("deleted sandbox's %s still resolves: %v", n, got)
		}
	}
	resolves(c, "after another sandbox's delete")
	// the next sandbox (on the deleted one's VMIDs where the node hands
	// them out again) resolves its own name only
	solo := oneVM("debian")
	solo.VMs[0].Name = "solo"
	d, err := b.e.Create(ctx, solo)
	if err != nil {
		t.Fatal(err)
	}
	resolves(d, "the next sandbox")
	for _, n := range []string{"attacker", "target", "web"} {
		if got := eg.lookup(t, d.Networks[0].VNet, n); got != nil {
			t.Errorf("the next sandbox (vmid %d; the deleted one's were %d, %d) resolves %s: %v", d.VMs[0].VMID, a.VMs[0].VMID, a.VMs[1].VMID, n, got)
		}
	}

	// a restart: the daemon's resolver starts without names; the
	// engine's start hands over those of its ready sandboxes
	eg.mu.Lock()
	eg.fresh()
	eg.mu.Unlock()
	if got := eg.lookup(t, c.Networks[0].VNet, "target"); got != nil {
		t.Fatalf("a fresh resolver knows target: %v", got)
	}
	b.e = b.restart(t)
	resolves(c, "after a restart")
	resolves(w, "after a restart")

	// names that cannot be handed over fail the create
	eg.mu.Lock()
	eg.fail = errors.New("refused")
	eg.mu.Unlock()
	if _, err := b.e.Create(ctx, two("allowlist")); err == nil {
		t.Error("a create whose names the resolver refused is ready")
	}
}
