package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// Issue 34 finding 5 and the egress half of finding 6: quotas per owner,
// and nothing of an owner outliving its instance.

// TestQuotaOwnerBeforeNode: the owner's share is checked before the node
// total, so an owner at its share is refused without taking any of the
// total; the total holds Owners owners at their share, and one more owner
// past that is refused by the node limit.
func TestQuotaOwnerBeforeNode(t *testing.T) {
	q := newQuota(2, 4) // two owners at their share fill the node
	steps := []struct {
		owner     string
		wantLimit string // "" for admitted
		wantTotal int
	}{
		{"a", "", 1}, {"a", "", 2},
		{"a", LimitOwner, 2}, // at its share: the total is untouched
		{"a", LimitOwner, 2},
		{"b", "", 3}, {"b", "", 4},
		{"c", LimitNode, 4}, // a third owner past what the node is sized for
		{"b", LimitOwner, 4},
	}
	for i, s := range steps {
		limit, ok := q.take(s.owner)
		if ok != (s.wantLimit == "") || limit != s.wantLimit {
			t.Errorf("step %d: take(%s) = %q, %v; want %q", i, s.owner, limit, ok, s.wantLimit)
		}
		if _, total := q.inUse(s.owner); total != s.wantTotal {
			t.Errorf("step %d: node total %d, want %d", i, total, s.wantTotal)
		}
	}
	q.give("a")
	if _, ok := q.take("c"); !ok {
		t.Error("a unit given back is not free for another owner")
	}
}

// TestResolverRefusesOwnerWithoutNodeUnits: past its share, an owner's
// queries are refused and counted for it (per resource and limit) without
// taking any of the node's queries in flight, which stay free for the
// others; a resolver's node totals are its shares times Owners.
func TestResolverRefusesOwnerWithoutNodeUnits(t *testing.T) {
	f := newResolverFixture(t)
	res := NewResolver(ResolverConfig{QueriesPerOwner: 3, TCPPerOwner: 2, Owners: 5}, f.res.reg, nil, f.den, f.up, slog.New(slog.DiscardHandler))
	if res.queries.node != 15 || res.conns.node != 10 {
		t.Fatalf("node totals %d and %d, want 15 and 10 (shares times owners)", res.queries.node, res.conns.node)
	}
	var held []func()
	for range 3 {
		release, ok := res.admit(res.queries, ResourceDNSUDP, "vneta")
		if !ok {
			t.Fatal("a query within the share refused")
		}
		held = append(held, release)
	}
	for range 50 {
		if _, ok := res.admit(res.queries, ResourceDNSUDP, "vneta"); ok {
			t.Fatal("a query past the share admitted")
		}
	}
	if _, total := res.queries.inUse("sb-allow"); total != 3 {
		t.Errorf("node total in use %d after 50 refusals, want 3 (the share held)", total)
	}
	if n := testutil.ToFloat64(f.den.refused.WithLabelValues("sb-allow", ResourceDNSUDP, LimitOwner)); n != 50 {
		t.Errorf("refusals counted for sb-allow: %v, want 50", n)
	}
	if n := testutil.ToFloat64(f.den.total.WithLabelValues("sb-allow", ReasonQuota)); n != 50 {
		t.Errorf("quota denials of sb-allow: %v, want 50", n)
	}
	release, ok := res.admit(res.queries, ResourceDNSUDP, "vnetc")
	if !ok {
		t.Fatal("another owner's query refused while the first is at its share")
	}
	release()
	for _, r := range held {
		r()
	}
	if _, total := res.queries.inUse("sb-allow"); total != 0 {
		t.Errorf("node total in use %d after every release", total)
	}
}

// TestProxyNodeTotalFitsOwners: the proxy's node total is its share times
// Owners (it was 1024 for shares of 256: four owners filled it).
func TestProxyNodeTotalFitsOwners(t *testing.T) {
	reg := NewRegistry(newFakeGuard(), Rules{Mode: firewall.EgressOpen}, nil)
	for _, tc := range []struct {
		cfg        ProxyConfig
		share, max int
	}{
		{ProxyConfig{}, DefaultProxyConnsPerOwner, DefaultProxyConnsPerOwner * DefaultOwners},
		{ProxyConfig{ConnsPerOwner: 256}, 256, 256 * DefaultOwners},
		{ProxyConfig{ConnsPerOwner: 8, Owners: 3}, 8, 24},
		{ProxyConfig{ConnsPerOwner: 8, MaxConns: 100}, 8, 100},
	} {
		p := NewProxy(tc.cfg, reg, nil, NewDenials(), slog.New(slog.DiscardHandler))
		if p.conns.perOwner != tc.share || p.conns.node != tc.max {
			t.Errorf("%+v: share %d, node total %d; want %d, %d", tc.cfg, p.conns.perOwner, p.conns.node, tc.share, tc.max)
		}
	}
}

// TestLearnCountsSetElements: the learned quota counts what the kernel
// counts, the elements of its sets: an address behind the name check is
// one, each port of a name:port entry one more. It counted addresses, so
// a name:port entry with many ports grew the sets past the cap.
func TestLearnCountsSetElements(t *testing.T) {
	ctx := context.Background()
	g := newFakeGuard()
	reg := NewRegistry(g, Rules{Mode: firewall.EgressOpen}, nil, WithMaxLearned(5))
	if err := reg.Set(ctx, "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressAllowlist}); err != nil {
		t.Fatal(err)
	}
	_, _, gen, err := reg.ForGen("vneta")
	if err != nil {
		t.Fatal(err)
	}
	a1, a2 := netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("203.0.113.2")
	cases := []struct {
		addrs []netip.Addr
		open  firewall.Opening
		quota bool // refused
		have  int  // elements after
	}{
		{[]netip.Addr{a1}, firewall.Opening{Checked: true, Ports: []uint16{22, 8443}}, false, 3},
		{[]netip.Addr{a1}, firewall.Opening{Checked: true, Ports: []uint16{22, 8443}}, false, 3}, // the same elements again
		{[]netip.Addr{a2}, firewall.Opening{Checked: true, Ports: []uint16{22, 8443}}, true, 3},  // 3 more: past 5
		{[]netip.Addr{a2}, firewall.Opening{Ports: []uint16{22}}, false, 4},
		{[]netip.Addr{a2}, firewall.Opening{Checked: true}, false, 5},
		{[]netip.Addr{a1}, firewall.Opening{Ports: []uint16{2222}}, true, 5},
	}
	for i, tc := range cases {
		_, err := reg.Learn(ctx, "vneta", gen, tc.addrs, tc.open, time.Hour)
		var qe *QuotaError
		if got := errors.As(err, &qe); got != tc.quota || (err != nil && !tc.quota) {
			t.Errorf("learn %d: %v, want quota refusal %v", i, err, tc.quota)
		}
		if got := reg.Learned("sb-a"); got != tc.have {
			t.Errorf("learn %d: %d elements counted, want %d", i, got, tc.have)
		}
		if tc.quota && (qe == nil || qe.Limit != LimitOwner || !errors.Is(err, ErrQuota)) {
			t.Errorf("learn %d: %v, want the owner's limit and ErrQuota", i, err)
		}
	}
}

// TestDefaultZonesOwnEach: every zone the daemon did not create is an
// owner of its own ("zone:<id>"; an interface of no zone "iface:<name>"),
// so their quotas and denials are apart. They all shared "node-default".
func TestDefaultZonesOwnEach(t *testing.T) {
	g := newFakeGuard()
	g.zoneOf = map[string]string{"vnetx": "zx", "vnety": "zy", "vnetx2": "zx"}
	reg := NewRegistry(g, Rules{Mode: firewall.EgressAllowlist}, nil)
	if err := reg.Set(context.Background(), "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressNone}); err != nil {
		t.Fatal(err)
	}
	for iface, want := range map[string]string{"vnetx": "zone:zx", "vnetx2": "zone:zx", "vnety": "zone:zy", "tap9i0": "iface:tap9i0", "vneta": "sb-a"} {
		if _, owner, err := reg.For(iface); err != nil || owner != want {
			t.Errorf("owner of %s: %q, %v; want %q", iface, owner, err, want)
		}
	}
	// one default zone at its share leaves the other its own
	res := NewResolver(ResolverConfig{QueriesPerOwner: 1}, reg, nil, NewDenials(), &fakeUpstream{}, slog.New(slog.DiscardHandler))
	if _, ok := res.admit(res.queries, ResourceDNSUDP, "vnetx"); !ok {
		t.Fatal("zx's first query refused")
	}
	if _, ok := res.admit(res.queries, ResourceDNSUDP, "vnety"); !ok {
		t.Error("zy's query refused while zx is at its share")
	}
}

// series returns how many series the collector exports with label=value.
func series(t *testing.T, c prometheus.Collector, label, value string) int {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					n++
				}
			}
		}
	}
	return n
}

// TestDenialsForgetDeletesSeries: a sandbox's egress series go with it
// (the denial counter's and the quota refusals'), another's stay. They
// stayed until restart.
func TestDenialsForgetDeletesSeries(t *testing.T) {
	den := NewDenials()
	den.Record("sb-a", Denial{Reason: ReasonName, Name: "evil.org."})
	den.Add("sb-a", ReasonAddress, 7)
	den.Record("sb-b", Denial{Reason: ReasonSNI, Name: "x.org"})
	den.Refuse("sb-a", ResourceProxy, LimitOwner, Denial{})
	if n := series(t, den.Collector(), "sandbox", "sb-a"); n != 3 {
		t.Fatalf("sb-a has %d denial series, want 3", n)
	}
	if n := series(t, den.Collector(), "owner", "sb-a"); n != 1 {
		t.Fatalf("sb-a has %d refusal series, want 1", n)
	}
	den.Forget("sb-a")
	if n := series(t, den.Collector(), "sandbox", "sb-a") + series(t, den.Collector(), "owner", "sb-a"); n != 0 {
		t.Errorf("%d series of sb-a after Forget", n)
	}
	if len(den.Recent("sb-a")) != 0 {
		t.Error("recent denials of sb-a after Forget")
	}
	if n := series(t, den.Collector(), "sandbox", "sb-b"); n != 1 || len(den.Recent("sb-b")) != 1 {
		t.Errorf("sb-b lost its record: %d series, %d recent", n, len(den.Recent("sb-b")))
	}
}

// TestBeginStartsClean: a new instance of a zone (a pool member claimed)
// starts with no denials, series or learned elements of the old one, and
// a denial decided under the old policy is not recorded for the new; a
// Set of the same instance keeps its record, a Remove drops it.
func TestBeginStartsClean(t *testing.T) {
	ctx := context.Background()
	g := newFakeGuard()
	reg := NewRegistry(g, Rules{Mode: firewall.EgressOpen}, nil)
	den := NewDenials()
	var dropped []string
	reg.OnDrop(func(zone, owner string) {
		dropped = append(dropped, zone+"/"+owner)
		den.Forget(owner)
	})
	allow := Rules{Mode: firewall.EgressAllowlist}
	if err := reg.Set(ctx, "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressNone}); err != nil {
		t.Fatal(err)
	}
	_, _, oldGen, _ := reg.ForGen("vneta")
	if _, err := reg.Learn(ctx, "vneta", oldGen, []netip.Addr{netip.MustParseAddr("203.0.113.9")}, firewall.Opening{Checked: true}, time.Hour); err != nil {
		t.Fatal(err)
	}
	den.Record("sb-a", Denial{Reason: ReasonMode, Name: "pool-period.example."})
	// a policy change of the same instance keeps its denials
	if err := reg.Set(ctx, "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressNone}); err != nil {
		t.Fatal(err)
	}
	if len(den.Recent("sb-a")) != 1 || len(dropped) != 0 {
		t.Fatalf("a Set of the same instance dropped its record: %v, %v", den.Recent("sb-a"), dropped)
	}
	_, _, midGen, _ := reg.ForGen("vneta")
	if err := reg.Begin(ctx, "za", "sb-a", []string{"vneta"}, allow); err != nil {
		t.Fatal(err)
	}
	if len(den.Recent("sb-a")) != 0 || series(t, den.Collector(), "sandbox", "sb-a") != 0 || reg.Learned("sb-a") != 0 {
		t.Errorf("the new instance sees the old one's record: %v, %d series, %d learned",
			den.Recent("sb-a"), series(t, den.Collector(), "sandbox", "sb-a"), reg.Learned("sb-a"))
	}
	// a denial the old policy decided, recorded late: not the new one's
	if reg.IfCurrent("vneta", midGen, func() { den.Record("sb-a", Denial{Reason: ReasonMode, Name: "late.example."}) }) {
		t.Error("IfCurrent ran for an old generation")
	}
	if len(den.Recent("sb-a")) != 0 {
		t.Errorf("a late denial of the old instance recorded: %v", den.Recent("sb-a"))
	}
	if err := reg.Remove(ctx, "za"); err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 2 || dropped[0] != "za/sb-a" || dropped[1] != "za/sb-a" {
		t.Errorf("OnDrop calls %v, want one for Begin and one for Remove", dropped)
	}
}

// TestKernelDropsNewGenerationIsBaseline: drops counted by the kernel
// under a zone's old policy (a pool member's) and read after the change
// are a new baseline, not the new instance's.
func TestKernelDropsNewGenerationIsBaseline(t *testing.T) {
	ctx := context.Background()
	reg := NewRegistry(newFakeGuard(), Rules{Mode: firewall.EgressOpen}, nil)
	if err := reg.Set(ctx, "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressNone}); err != nil {
		t.Fatal(err)
	}
	den := NewDenials()
	f := &fakeDrops{ifs: []firewall.EgressDrop{{Iface: "vneta", Packets: 5}}}
	k := NewKernelDrops(f, reg, den, nil, 0, nil)
	count := func() float64 { return testutil.ToFloat64(den.total.WithLabelValues("sb-a", ReasonAddress)) }
	if err := k.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	f.ifs = []firewall.EgressDrop{{Iface: "vneta", Packets: 9}}
	// the pool member claimed: a new instance of the same zone and owner
	if err := reg.Begin(ctx, "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressAllowlist}); err != nil {
		t.Fatal(err)
	}
	if err := k.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if c := count(); c != 0 {
		t.Errorf("drops from before the change counted: %v", c)
	}
	f.ifs = []firewall.EgressDrop{{Iface: "vneta", Packets: 12}}
	if err := k.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if c := count(); c != 3 {
		t.Errorf("drops under the new policy counted %v, want 3", c)
	}
}

// TestZonesGoneForgetsDefaultOwner: a zone the daemon did not create is
// an owner of its own; when it is gone from the node, its denials and
// series go with it (OnDrop), a sandbox's zone with its own policy is
// left to Remove, and other zones keep theirs.
func TestZonesGoneForgetsDefaultOwner(t *testing.T) {
	g := newFakeGuard()
	g.zoneOf = map[string]string{"vnetx": "zx", "vnety": "zy"}
	reg := NewRegistry(g, Rules{Mode: firewall.EgressAllowlist}, nil)
	if err := reg.Set(context.Background(), "za", "sb-a", []string{"vneta"}, Rules{Mode: firewall.EgressNone}); err != nil {
		t.Fatal(err)
	}
	den := NewDenials()
	reg.OnDrop(func(_, owner string) { den.Forget(owner) })
	for _, o := range []string{"zone:zx", "zone:zy", "sb-a"} {
		den.Record(o, Denial{Reason: ReasonName, Name: "x.example."})
	}
	reg.ZonesGone([]string{"zx", "za"})
	if len(den.Recent("zone:zx")) != 0 || series(t, den.Collector(), "sandbox", "zone:zx") != 0 {
		t.Error("a zone gone kept its denials or series")
	}
	if len(den.Recent("zone:zy")) != 1 || len(den.Recent("sb-a")) != 1 {
		t.Errorf("other owners lost their record: zy %v, sb-a %v", den.Recent("zone:zy"), den.Recent("sb-a"))
	}
}

// countingLinks names index i "vnet<i>" and counts the look-ups.
type countingLinks struct{ calls int }

func (c *countingLinks) ByIndex(i int) (string, error) {
	c.calls++
	return fmt.Sprintf("vnet%d", i), nil
}

func (c *countingLinks) ByAddr(netip.Addr) (string, error) { return "", errors.New("no address") }

func (c *countingLinks) Holds(int, netip.Addr) (bool, error) { return false, errors.New("no address") }

// TestIndexNamesOwner: the read loop names a query's owner from what it
// remembered for a second, and looks it up again at once when a policy
// changed (a claim, a delete), so a query never takes the old owner's
// share after the change.
func TestIndexNamesOwner(t *testing.T) {
	ctx := context.Background()
	reg := NewRegistry(newFakeGuard(), Rules{Mode: firewall.EgressOpen}, nil)
	if err := reg.Set(ctx, "za", "sb-a", []string{"vnet7"}, Rules{Mode: firewall.EgressNone}); err != nil {
		t.Fatal(err)
	}
	l := &countingLinks{}
	n := newIndexNames(l, reg)
	clock := time.Unix(1000, 0)
	n.now = func() time.Time { return clock }
	for range 100 {
		if name, owner, _, err := n.byIndex(7); err != nil || name != "vnet7" || owner != "sb-a" {
			t.Fatalf("byIndex(7) = %s, %s, %v", name, owner, err)
		}
	}
	if l.calls != 1 {
		t.Errorf("%d netlink look-ups for 100 queries within a second, want 1", l.calls)
	}
	if err := reg.Remove(ctx, "za"); err != nil {
		t.Fatal(err)
	}
	if err := reg.Set(ctx, "zb", "sb-b", []string{"vnet7"}, Rules{Mode: firewall.EgressNone}); err != nil {
		t.Fatal(err)
	}
	if _, owner, _, _ := n.byIndex(7); owner != "sb-b" {
		t.Errorf("owner after the zone changed hands: %q, want sb-b", owner)
	}
	clock = clock.Add(2 * time.Second)
	if _, _, _, err := n.byIndex(7); err != nil || l.calls != 3 {
		t.Errorf("after a second: %v, %d look-ups, want 3", err, l.calls)
	}
}
