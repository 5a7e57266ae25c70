package egress

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func rr(t testing.TB, s string) dns.RR {
	t.Helper()
	r, err := dns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

type resolverFixture struct {
	g   *fakeGuard
	up  *fakeUpstream
	den *Denials
	res *Resolver
}

func newResolverFixture(t testing.TB) *resolverFixture {
	t.Helper()
	g := newFakeGuard()
	def, err := Compile(Policy{Mode: "none"})
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry(g, def, nil)
	allow, err := Compile(Policy{Mode: "allowlist", Allow: []string{"pypi.org", "*.github.com"}, Deny: []string{"203.0.113.66"}})
	if err != nil {
		t.Fatal(err)
	}
	open, _ := Compile(Policy{Mode: "open"})
	ctx := context.Background()
	if err := reg.Set(ctx, "za", "sb-allow", []string{"vneta"}, allow); err != nil {
		t.Fatal(err)
	}
	if err := reg.Set(ctx, "zc", "sb-open", []string{"vnetc"}, open); err != nil {
		t.Fatal(err)
	}
	up := &fakeUpstream{answers: map[string][]dns.RR{
		"pypi.org.": {rr(t, "pypi.org. 5 IN A 203.0.113.10"), rr(t, "pypi.org. 5 IN A 10.0.0.1")},
		"api.github.com.": {rr(t, "api.github.com. 86400 IN CNAME cdn.example.net."),
			rr(t, "cdn.example.net. 86400 IN A 203.0.113.20"), rr(t, "cdn.example.net. 86400 IN A 203.0.113.66")},
	}}
	den := NewDenials()
	res := NewResolver(ResolverConfig{TTLFloor: 30 * time.Second, TTLCeiling: time.Hour}, reg, nil, den, up, slog.New(slog.DiscardHandler))
	return &resolverFixture{g: g, up: up, den: den, res: res}
}

func query(t testing.TB, name string, typ uint16) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, typ)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestResolverAnswer(t *testing.T) {
	cases := []struct {
		name      string
		iface     string
		q         []byte
		rcode     int
		answers   []string // A addresses the guest sees
		upstream  bool     // whether the upstream is asked
		learned   map[netip.Addr]time.Duration
		deniedFor string
	}{
		{name: "allowed name: answer, learned with the floor TTL, private address cut",
			iface: "vneta", q: query(t, "PyPI.org.", dns.TypeA), rcode: dns.RcodeSuccess, answers: []string{"203.0.113.10"}, upstream: true,
			learned: map[netip.Addr]time.Duration{netip.MustParseAddr("203.0.113.10"): 30 * time.Second}},
		{name: "wildcard through a CNAME, ceiling TTL, denied CIDR cut",
			iface: "vneta", q: query(t, "api.github.com.", dns.TypeA), rcode: dns.RcodeSuccess, answers: []string{"203.0.113.20"}, upstream: true,
			learned: map[netip.Addr]time.Duration{netip.MustParseAddr("203.0.113.20"): time.Hour}},
		{name: "disallowed name: NXDOMAIN without asking upstream",
			iface: "vneta", q: query(t, "tunnel-c2lkZQ.evil.org.", dns.TypeA), rcode: dns.RcodeNameError, deniedFor: "sb-allow"},
		{name: "disallowed TXT: NXDOMAIN without asking upstream",
			iface: "vneta", q: query(t, "x.evil.org.", dns.TypeTXT), rcode: dns.RcodeNameError, deniedFor: "sb-allow"},
		{name: "allowed name, AAAA: empty NOERROR without asking upstream",
			iface: "vneta", q: query(t, "pypi.org.", dns.TypeAAAA), rcode: dns.RcodeSuccess},
		{name: "allowed name, TXT: empty NOERROR without asking upstream",
			iface: "vneta", q: query(t, "pypi.org.", dns.TypeTXT), rcode: dns.RcodeSuccess},
		{name: "default none: NXDOMAIN", iface: "vnetz", q: query(t, "pypi.org.", dns.TypeA), rcode: dns.RcodeNameError, deniedFor: DefaultOwnerOf("", "vnetz")},
		{name: "management interface: REFUSED", iface: "mgmt0", q: query(t, "pypi.org.", dns.TypeA), rcode: dns.RcodeRefused},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newResolverFixture(t)
			out := f.res.Answer(context.Background(), tc.iface, tc.q, 512)
			var m dns.Msg
			if err := m.Unpack(out); err != nil {
				t.Fatalf("answer does not parse: %v", err)
			}
			if m.Rcode != tc.rcode {
				t.Errorf("rcode %s, want %s", dns.RcodeToString[m.Rcode], dns.RcodeToString[tc.rcode])
			}
			var got []string
			for _, r := range m.Answer {
				if a, ok := r.(*dns.A); ok {
					got = append(got, a.A.String())
					if time.Duration(a.Hdr.Ttl)*time.Second > f.g.learned[tc.iface][netip.MustParseAddr(a.A.String())] {
						t.Errorf("guest TTL %d outlives the set timeout", a.Hdr.Ttl)
					}
				}
			}
			if !slices.Equal(got, tc.answers) {
				t.Errorf("answers %v, want %v", got, tc.answers)
			}
			if asked := len(f.up.queries()) > 0; asked != tc.upstream {
				t.Errorf("upstream asked: %v (%v), want %v", asked, f.up.queries(), tc.upstream)
			}
			for a, ttl := range tc.learned {
				if f.g.learned[tc.iface][a] != ttl {
					t.Errorf("learned %s for %s: %v, want %v", a, tc.iface, f.g.learned[tc.iface][a], ttl)
				}
			}
			if len(f.g.learned[tc.iface]) != len(tc.learned) {
				t.Errorf("learned %v, want %v", f.g.learned[tc.iface], tc.learned)
			}
			if tc.deniedFor != "" {
				if n := len(f.den.Recent(tc.deniedFor)); n != 1 {
					t.Errorf("%d recent denials for %s, want 1", n, tc.deniedFor)
				}
				if n := testutil.CollectAndCount(f.den.Collector()); n != 1 {
					t.Errorf("%d denial series, want 1", n)
				}
			}
		})
	}
}

func TestResolverIgnoresNonQueries(t *testing.T) {
	f := newResolverFixture(t)
	resp := new(dns.Msg)
	resp.SetQuestion("pypi.org.", dns.TypeA)
	resp.Response = true
	b, _ := resp.Pack()
	for _, in := range [][]byte{nil, {1, 2, 3}, b} {
		if out := f.res.Answer(context.Background(), "vneta", in, 512); out != nil {
			t.Errorf("answered %x", in)
		}
	}
	two := new(dns.Msg)
	two.SetQuestion("pypi.org.", dns.TypeA)
	two.Question = append(two.Question, two.Question[0])
	b, _ = two.Pack()
	var m dns.Msg
	if err := m.Unpack(f.res.Answer(context.Background(), "vneta", b, 512)); err != nil || m.Rcode != dns.RcodeRefused {
		t.Errorf("two questions: %v %v, want REFUSED", m.Rcode, err)
	}
	if q := f.up.queries(); len(q) != 0 {
		t.Errorf("upstream asked %v", q)
	}
}

func TestRegistrySetFailsChangesNothing(t *testing.T) {
	g := newFakeGuard()
	reg := NewRegistry(g, Rules{Mode: "open"}, nil)
	r, _ := Compile(Policy{Mode: "none"})
	g.failSet = net.ErrClosed
	if err := reg.Set(context.Background(), "za", "sb", []string{"vneta"}, r); err == nil {
		t.Fatal("Set succeeded although the guard failed")
	}
	if _, ok := reg.Get("za"); ok {
		t.Error("a failed Set was kept")
	}
	if got, owner, _ := reg.For("vneta"); got.Mode != "open" || owner != DefaultOwnerOf("", "vneta") {
		t.Errorf("For = %v %s after a failed Set", got.Mode, owner)
	}
}

// FuzzResolverAnswer: no query panics the resolver, every answer parses,
// and no name outside the allow-list ever reaches the upstream.
func FuzzResolverAnswer(f *testing.F) {
	f.Add(query(f, "pypi.org.", dns.TypeA))
	f.Add(query(f, "evil.org.", dns.TypeTXT))
	f.Add(query(f, "x.api.github.com.", dns.TypeA))
	fx := newResolverFixture(f)
	allow, _, _ := fx.res.reg.For("vneta")
	f.Fuzz(func(t *testing.T, q []byte) {
		out := fx.res.Answer(context.Background(), "vneta", q, 512)
		if out != nil {
			var m dns.Msg
			if err := m.Unpack(out); err != nil {
				t.Fatalf("answer does not parse: %v", err)
			}
		}
		for _, n := range fx.up.queries() {
			if !allow.AllowsName(n) {
				t.Fatalf("disallowed name %q went upstream", n)
			}
		}
	})
}
