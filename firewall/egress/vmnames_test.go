package egress

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// namesFixture is a resolver with two sandboxes that use the same VM
// names: sb-a (zone za, bridge vneta, its mode per test) and sb-b (zone
// zb, bridge vnetb, allowlist); vnetz is under the node default (none).
// The zones' dnsmasq is one stand-in on 127.0.0.1 that answers NXDOMAIN
// and remembers every question; the upstream knows every name.
type namesFixture struct {
	reg   *Registry
	res   *Resolver
	up    *fakeUpstream
	zone  *zoneDNS
	log   *Log
	local netip.Addr
}

var (
	aAttacker = netip.MustParseAddr("10.20.0.2")
	aTarget   = netip.MustParseAddr("10.20.0.3")
	bTarget   = netip.MustParseAddr("10.30.0.3")
	bSecret   = netip.MustParseAddr("10.30.0.9")
)

func newNamesFixture(t *testing.T, modeA string) *namesFixture {
	t.Helper()
	z := startZoneDNS(t, func(_, m *dns.Msg) { m.Rcode = dns.RcodeNameError })
	_, port, _ := net.SplitHostPort(z.addr)
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
	}
	none, _ := Compile(Policy{Mode: "none"})
	reg := NewRegistry(newFakeGuard(), none, nil)
	ctx := context.Background()
	pa, err := Compile(Policy{Mode: modeA, Allow: allowFor(modeA)})
	if err != nil {
		t.Fatal(err)
	}
	pb, _ := Compile(Policy{Mode: "allowlist", Allow: []string{"*.sandbox.internal"}})
	if err := reg.Begin(ctx, "za", "sb-a", []string{"vneta"}, pa); err != nil {
		t.Fatal(err)
	}
	if err := reg.Begin(ctx, "zb", "sb-b", []string{"vnetb"}, pb); err != nil {
		t.Fatal(err)
	}
	up := &fakeUpstream{answers: map[string][]dns.RR{}}
	for _, n := range []string{"target.", "secret.", "attacker.", "target.zb.sandbox.internal."} {
		up.answers[n] = []dns.RR{rr(t, n+" 60 IN A 203.0.113.7")}
	}
	elog := NewLog(LogConfig{PerOwner: 256})
	res := NewResolver(ResolverConfig{Dial: dial, Timeout: 2 * time.Second, Log: elog,
		Domain: func(zone string) string { return zone + ".Sandbox.Internal." }},
		reg, nil, NewDenials(), up, slog.New(slog.DiscardHandler))
	f := &namesFixture{reg: reg, res: res, up: up, zone: z, log: elog, local: netip.MustParseAddr("127.0.0.1")}
	f.setNames(t, "za", "sb-a", map[string][]NameAddr{
		"attacker": {{Bridge: "vneta", Addr: aAttacker}}, "Target": {{Bridge: "vneta", Addr: aTarget}}})
	f.setNames(t, "zb", "sb-b", map[string][]NameAddr{
		"target": {{Bridge: "vnetb", Addr: bTarget}}, "secret": {{Bridge: "vnetb", Addr: bSecret}}})
	return f
}

// allowFor is an allow-list that would let the test names under the
// zones' domain upstream (a bare label is no allow entry): the VM names
// must be answered before it is consulted.
func allowFor(mode string) []string {
	if mode != "allowlist" {
		return nil
	}
	return []string{"*.sandbox.internal"}
}

func (f *namesFixture) setNames(t *testing.T, zone, owner string, names map[string][]NameAddr) {
	t.Helper()
	if err := f.reg.SetNames(zone, owner, names); err != nil {
		t.Fatal(err)
	}
}

// ask sends name (type typ) as a guest on iface to its zone's address.
func (f *namesFixture) ask(t *testing.T, iface, name string, typ uint16) *dns.Msg {
	t.Helper()
	out := f.res.answer(context.Background(), iface, f.local, netip.MustParseAddr("10.20.0.2"), query(t, name, typ), 512)
	var m dns.Msg
	if err := m.Unpack(out); err != nil {
		t.Fatalf("%s %s on %s: answer does not parse: %v", name, dns.TypeToString[typ], iface, err)
	}
	return &m
}

// addrs are the A and AAAA addresses of m's answer.
func addrs(m *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, r := range m.Answer {
		switch v := r.(type) {
		case *dns.A:
			a, _ := netip.AddrFromSlice(v.A.To4())
			out = append(out, a)
		case *dns.AAAA:
			a, _ := netip.AddrFromSlice(v.AAAA)
			out = append(out, a)
		}
	}
	return out
}

// answeredAs reports whether m is the resolver's own answer for a VM
// name: authoritative NOERROR with exactly want.
func answeredAs(m *dns.Msg, want ...netip.Addr) bool {
	return m.Rcode == dns.RcodeSuccess && m.Authoritative && slices.Equal(addrs(m), want)
}

// TestVMNamesEveryMode: in each mode, a guest of sb-a resolves its
// siblings and itself by their VM names (any case, with or without the
// zone's domain, which is matched in any case too) to their IPAM
// addresses, authoritative, without asking the zone's dnsmasq or
// upstream (an allow-list that allows the names is not consulted);
// AAAA and every other type of a VM name are NOERROR with no data; each
// question is in sb-a's record as a zone-local one. sb-b's names, which
// overlap sb-a's, never answer with sb-b's addresses in sb-a and take
// the path they took before (open: the zone's dnsmasq; allowlist:
// upstream; none: NXDOMAIN).
func TestVMNamesEveryMode(t *testing.T) {
	for _, mode := range []string{"open", "allowlist", "none"} {
		t.Run(mode, func(t *testing.T) {
			f := newNamesFixture(t, mode)
			for _, q := range []struct {
				name string
				want netip.Addr
			}{
				{"target.", aTarget}, {"TARGET.", aTarget}, {"TaRgEt.ZA.sandbox.INTERNAL.", aTarget},
				{"attacker.", aAttacker}, {"attacker.za.sandbox.internal.", aAttacker},
			} {
				m := f.ask(t, "vneta", q.name, dns.TypeA)
				if !answeredAs(m, q.want) {
					t.Errorf("%s A: %s aa=%v %v, want authoritative %v", q.name, dns.RcodeToString[m.Rcode], m.Authoritative, addrs(m), q.want)
				}
				if len(m.Answer) == 1 && (m.Answer[0].Header().Name != q.name || m.Answer[0].Header().Ttl != vmNameTTL) {
					t.Errorf("%s: answer record %v, want the name as asked, TTL %d", q.name, m.Answer[0], vmNameTTL)
				}
			}
			for _, typ := range []uint16{dns.TypeAAAA, dns.TypeTXT, dns.TypeMX} {
				if m := f.ask(t, "vneta", "target.", typ); !answeredAs(m) {
					t.Errorf("target %s: %s aa=%v %v, want authoritative NOERROR, no data", dns.TypeToString[typ], dns.RcodeToString[m.Rcode], m.Authoritative, m.Answer)
				}
			}
			if len(f.zone.questions()) != 0 || len(f.up.queries()) != 0 {
				t.Fatalf("a VM name was asked elsewhere: zone %v upstream %v", f.zone.questions(), f.up.queries())
			}
			recs := f.log.Read("sb-a", LogQuery{Type: RecordDNS}).Records
			if len(recs) != 8 {
				t.Fatalf("%d records, want 8: %+v", len(recs), recs)
			}
			if r := recs[0]; r.Name != "target" || r.QType != "A" || r.Verdict != VerdictAnswered || r.Reason != ReasonZone ||
				r.Rcode != "NOERROR" || !slices.Equal(r.Answers, []netip.Addr{aTarget}) {
				t.Errorf("record %+v, want target A answered (zone) with %v", r, aTarget)
			}

			// sb-b's names (and sb-b's own name for "target" under its
			// own domain) are not sb-a's: never sb-b's address
			for _, n := range []string{"secret.", "target.zb.sandbox.internal.", "secret.zb.sandbox.internal."} {
				m := f.ask(t, "vneta", n, dns.TypeA)
				for _, a := range addrs(m) {
					if a == bSecret || a == bTarget {
						t.Errorf("%s in sb-a answered sb-b's %v", n, a)
					}
				}
				if m.Authoritative {
					t.Errorf("%s in sb-a answered as a VM name of sb-a", n)
				}
				switch mode {
				case "none":
					if m.Rcode != dns.RcodeNameError {
						t.Errorf("%s under none: %s, want NXDOMAIN", n, dns.RcodeToString[m.Rcode])
					}
				case "open":
					if qs := f.zone.questions(); len(qs) == 0 || qs[len(qs)-1].Question[0].Name != n {
						t.Errorf("%s under open: not asked of the zone's dnsmasq as before", n)
					}
				}
			}
			// and sb-b's guests get sb-b's own
			if m := f.ask(t, "vnetb", "Target.", dns.TypeA); !answeredAs(m, bTarget) {
				t.Errorf("target in sb-b: %v, want %v", addrs(m), bTarget)
			}
			// the name without its trailing dot (the wire always has it)
			_, _, _, began, _ := f.reg.forAnswer("vneta")
			if a, ok := f.res.sandboxName("vneta", began, "TARGET"); !ok || !slices.Equal(a, []netip.Addr{aTarget}) {
				t.Errorf("TARGET without the dot: %v %v", a, ok)
			}
			// an interface under the node default has no VM names
			if m := f.ask(t, "vnetz", "target.", dns.TypeA); m.Rcode != dns.RcodeNameError || len(m.Answer) != 0 {
				t.Errorf("target on a default interface: %s %v, want NXDOMAIN", dns.RcodeToString[m.Rcode], m.Answer)
			}
		})
	}
}

// TestVMNamesInstance: the names stay across a policy change of the
// same sandbox (and the same zone's Set of the check's re-apply), and
// go with the instance: a claim (Begin) answers none of the member's
// until the claimer's are handed over; a delete (Remove) none, also for
// a new sandbox that gets the same bridge; a Set that gives the zone to
// another owner none. A question decided under an instance that has
// ended is never answered from the next instance's names.
func TestVMNamesInstance(t *testing.T) {
	ctx := context.Background()
	f := newNamesFixture(t, "allowlist")
	target := func(iface string) *dns.Msg { return f.ask(t, iface, "target.", dns.TypeA) }
	none, _ := Compile(Policy{Mode: "none"})
	open, _ := Compile(Policy{Mode: "open"})
	for _, p := range []Rules{none, open, none} {
		if err := f.reg.Set(ctx, "za", "sb-a", []string{"vneta"}, p); err != nil {
			t.Fatal(err)
		}
		if m := target("vneta"); !answeredAs(m, aTarget) {
			t.Fatalf("after a policy change to %s: %v, want %v", p.Mode, addrs(m), aTarget)
		}
	}
	_, _, _, oldBegan, _ := f.reg.forAnswer("vneta")

	// a claim: the member's names go; the claimer's come with SetNames
	if err := f.reg.Begin(ctx, "za", "sb-a", []string{"vneta"}, none); err != nil {
		t.Fatal(err)
	}
	if m := target("vneta"); m.Authoritative || len(m.Answer) != 0 {
		t.Errorf("after a claim, before its names: %v, want no VM name", addrs(m))
	}
	web := netip.MustParseAddr("10.20.0.7")
	f.setNames(t, "za", "sb-a", map[string][]NameAddr{"web": {{Bridge: "vneta", Addr: web}}})
	if m := f.ask(t, "vneta", "web.", dns.TypeA); !answeredAs(m, web) {
		t.Errorf("claimer's name: %v, want %v", addrs(m), web)
	}
	if m := target("vneta"); m.Authoritative {
		t.Errorf("the member's name target answered after the claim: %v", addrs(m))
	}
	// a question decided under the old instance
	if a, ok := f.reg.vmName("vneta", "za", oldBegan, "web"); ok {
		t.Errorf("a question of the ended instance got the claimer's %v", a)
	}
	if _, ok := f.res.sandboxName("vneta", oldBegan, "web."); ok {
		t.Error("the resolver answered a question of the ended instance")
	}

	// another owner for the zone
	if err := f.reg.Set(ctx, "za", "sb-x", []string{"vneta"}, none); err != nil {
		t.Fatal(err)
	}
	if m := f.ask(t, "vneta", "web.", dns.TypeA); m.Authoritative || len(m.Answer) != 0 {
		t.Errorf("another owner of the zone got the names: %v", addrs(m))
	}
	if err := f.reg.SetNames("za", "sb-a", nil); !errors.Is(err, ErrNotOwner) {
		t.Errorf("SetNames of the old owner: %v, want ErrNotOwner", err)
	}

	// a delete: nothing, also for the next sandbox on the same bridge
	if err := f.reg.Remove(ctx, "zb"); err != nil {
		t.Fatal(err)
	}
	if m := target("vnetb"); m.Authoritative || len(m.Answer) != 0 {
		t.Errorf("after the delete: %v", addrs(m))
	}
	if err := f.reg.Begin(ctx, "zn", "sb-n", []string{"vnetb"}, open); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"target.", "secret."} {
		if _, ok := f.res.sandboxName("vnetb", 1<<62, n); ok {
			t.Errorf("%s answered for a made-up instance", n)
		}
		_, _, _, began, _ := f.reg.forAnswer("vnetb")
		if a, ok := f.res.sandboxName("vnetb", began, n); ok {
			t.Errorf("the next sandbox on vnetb resolves the deleted one's %s to %v", n, a)
		}
	}
	if err := f.reg.SetNames("zb", "sb-b", nil); !errors.Is(err, ErrNotOwner) {
		t.Errorf("SetNames of a deleted sandbox: %v, want ErrNotOwner", err)
	}
	f.reg.mu.Lock()
	_, kept := f.reg.names["zb"]
	f.reg.mu.Unlock()
	if kept {
		t.Error("the deleted zone's names are still held")
	}
}

// TestVMNamesConcurrentClaim: questions asked while the zone is claimed
// again and again (Begin, then the claimer's SetNames) only ever get the
// addresses of the instance they were decided under: the address a
// claim's names give is never answered to a question of an instance
// whose names were another's (run under -race).
func TestVMNamesConcurrentClaim(t *testing.T) {
	ctx := context.Background()
	f := newNamesFixture(t, "none")
	none, _ := Compile(Policy{Mode: "none"})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[uint64]netip.Addr{} // began -> the address its names gave
	bad := 0
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _, _, began, err := f.reg.forAnswer("vneta")
				if err != nil {
					continue
				}
				a, ok := f.res.sandboxName("vneta", began, "target.")
				if !ok || len(a) != 1 {
					continue
				}
				mu.Lock()
				if prev, had := seen[began]; had && prev != a[0] {
					bad++
				}
				seen[began] = a[0]
				mu.Unlock()
			}
		})
	}
	for i := range 200 {
		if err := f.reg.Begin(ctx, "za", "sb-a", []string{"vneta"}, none); err != nil {
			t.Fatal(err)
		}
		f.setNames(t, "za", "sb-a", map[string][]NameAddr{"target": {{Bridge: "vneta", Addr: netip.AddrFrom4([4]byte{10, 20, byte(i / 250), byte(i%250 + 1)})}}})
	}
	close(stop)
	wg.Wait()
	if bad != 0 {
		t.Errorf("%d answers gave an instance another instance's address", bad)
	}
}

// TestVMNamesRefused: SetNames refuses a zone of another owner or of
// none, an address on a bridge not the zone's, a name that is no DNS
// label (a dotted name would shadow a real domain), the same name twice
// in two cases, and past the bounds; nothing changes on a refusal.
func TestVMNamesRefused(t *testing.T) {
	f := newNamesFixture(t, "none")
	ok := []NameAddr{{Bridge: "vneta", Addr: aTarget}}
	many := map[string][]NameAddr{}
	for i := range MaxVMNames + 1 {
		many["vm"+strings.Repeat("x", i%5)+string(rune('a'+i%26))+string(rune('a'+i/26))] = ok
	}
	cases := []struct {
		name        string
		zone, owner string
		names       map[string][]NameAddr
	}{
		{"another owner's zone", "zb", "sb-a", map[string][]NameAddr{"x": ok}},
		{"no such zone", "zq", "sb-a", map[string][]NameAddr{"x": ok}},
		{"another sandbox's bridge", "za", "sb-a", map[string][]NameAddr{"x": {{Bridge: "vnetb", Addr: aTarget}}}},
		{"a dotted name", "za", "sb-a", map[string][]NameAddr{"pypi.org": ok}},
		{"no label", "za", "sb-a", map[string][]NameAddr{"a b": ok}},
		{"empty", "za", "sb-a", map[string][]NameAddr{"": ok}},
		{"twice", "za", "sb-a", map[string][]NameAddr{"web": ok, "WEB": ok}},
		{"no address", "za", "sb-a", map[string][]NameAddr{"x": {{Bridge: "vneta"}}}},
		{"too many names", "za", "sb-a", many},
		{"too many addresses", "za", "sb-a", map[string][]NameAddr{"x": slices.Repeat(ok, MaxNameAddrs+1)}},
	}
	for _, tc := range cases {
		if err := f.reg.SetNames(tc.zone, tc.owner, tc.names); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if m := f.ask(t, "vneta", "target.", dns.TypeA); !answeredAs(m, aTarget) {
		t.Errorf("after the refusals: %v, want the names in force before them", addrs(m))
	}
	if m := f.ask(t, "vnetb", "target.", dns.TypeA); !answeredAs(m, bTarget) {
		t.Errorf("sb-b after the refusals: %v", addrs(m))
	}
}

// TestVMNamesAddressPerBridge: a VM on two networks answers with its
// address on the bridge the question came in on; a VM not on it with
// its first address (as its /etc/hosts line); IPv6 addresses answer
// AAAA only.
func TestVMNamesAddressPerBridge(t *testing.T) {
	ctx := context.Background()
	none, _ := Compile(Policy{Mode: "none"})
	reg := NewRegistry(newFakeGuard(), none, nil)
	if err := reg.Begin(ctx, "zm", "sb-m", []string{"v1", "v2"}, none); err != nil {
		t.Fatal(err)
	}
	res := NewResolver(ResolverConfig{}, reg, nil, NewDenials(), &fakeUpstream{}, slog.New(slog.DiscardHandler))
	a1, a2, b2, v6 := netip.MustParseAddr("10.1.0.5"), netip.MustParseAddr("10.2.0.5"), netip.MustParseAddr("10.2.0.6"), netip.MustParseAddr("fd00::6")
	if err := reg.SetNames("zm", "sb-m", map[string][]NameAddr{
		"both": {{Bridge: "v1", Addr: a1}, {Bridge: "v2", Addr: a2}},
		"two":  {{Bridge: "v2", Addr: b2}, {Bridge: "v2", Addr: v6}},
	}); err != nil {
		t.Fatal(err)
	}
	ask := func(iface, name string, typ uint16) []netip.Addr {
		var m dns.Msg
		if err := m.Unpack(res.Answer(ctx, iface, query(t, name, typ), 512)); err != nil {
			t.Fatal(err)
		}
		return addrs(&m)
	}
	for _, tc := range []struct {
		iface, name string
		typ         uint16
		want        []netip.Addr
	}{
		{"v1", "both.", dns.TypeA, []netip.Addr{a1}},
		{"v2", "both.", dns.TypeA, []netip.Addr{a2}},
		{"v1", "two.", dns.TypeA, []netip.Addr{b2}},
		{"v2", "two.", dns.TypeA, []netip.Addr{b2}},
		{"v2", "two.", dns.TypeAAAA, []netip.Addr{v6}},
		{"v1", "both.", dns.TypeAAAA, nil},
	} {
		if got := ask(tc.iface, tc.name, tc.typ); !slices.Equal(got, tc.want) {
			t.Errorf("%s %s on %s: %v, want %v", tc.name, dns.TypeToString[tc.typ], tc.iface, got, tc.want)
		}
	}
}
