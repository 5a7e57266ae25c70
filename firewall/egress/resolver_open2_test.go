package egress

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// openResolver is a resolver whose zone dnsmasq is z, for the open
// sandbox sb-open on vnetc (the node default none), recording into elog.
func openResolver(t *testing.T, z *zoneDNS, elog *Log) (*Resolver, *Registry) {
	t.Helper()
	_, port, _ := net.SplitHostPort(z.addr)
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
	}
	none, _ := Compile(Policy{Mode: "none"})
	open, _ := Compile(Policy{Mode: "open"})
	reg := NewRegistry(newFakeGuard(), none, nil)
	if err := reg.Set(context.Background(), "zc", "sb-open", []string{"vnetc"}, open); err != nil {
		t.Fatal(err)
	}
	return NewResolver(ResolverConfig{Dial: dial, Timeout: 2 * time.Second, Log: elog}, reg, nil, NewDenials(), &fakeUpstream{}, slog.New(slog.DiscardHandler)), reg
}

// TestResolverOpenAnswerAcrossPolicyChange (found by review): a question
// of an open sandbox is in flight at its zone's dnsmasq when the
// sandbox's policy becomes none. The answer is not handed over (SERVFAIL,
// as the allow-list path answers a stale one; the guest asks again under
// the new policy), and the question, which left the node through the
// dnsmasq under open, is in the sandbox's record: a policy change keeps
// the instance (openRing records by instance).
func TestResolverOpenAnswerAcrossPolicyChange(t *testing.T) {
	asked := make(chan struct{}, 1)
	release := make(chan struct{})
	z := startZoneDNS(t, func(q, m *dns.Msg) {
		asked <- struct{}{}
		<-release
		m.Answer = append(m.Answer, rr(t, q.Question[0].Name+" 60 IN A 203.0.113.10"))
	})
	elog := NewLog(LogConfig{PerOwner: 64})
	res, reg := openResolver(t, z, elog)
	ctx := context.Background()
	none, _ := Compile(Policy{Mode: "none"})
	out := make(chan []byte, 1)
	go func() {
		out <- res.answer(ctx, "vnetc", netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.10.3.100"), query(t, "exfil.example.", dns.TypeA), 512)
	}()
	<-asked
	if err := reg.Set(ctx, "zc", "sb-open", []string{"vnetc"}, none); err != nil {
		t.Fatal(err)
	}
	close(release)
	var m dns.Msg
	if err := m.Unpack(<-out); err != nil {
		t.Fatal(err)
	}
	n := len(elog.Read("sb-open", LogQuery{Type: RecordDNS}).Records)
	t.Logf("after the change to none: rcode %s, %d answers; %d DNS records of the question", dns.RcodeToString[m.Rcode], len(m.Answer), n)
	if m.Rcode != dns.RcodeServerFailure || len(m.Answer) != 0 {
		t.Errorf("a none sandbox got the open policy's answer %v (%s), want SERVFAIL as the allowlist path gives (ErrStale)", m.Answer, dns.RcodeToString[m.Rcode])
	}
	if n != 1 {
		t.Errorf("%d records of a question that left the node under open, want 1", n)
	}
}

// TestResolverOpenTruncatesForUDP: a zone answer longer than the guest's
// UDP size comes back cut with TC set (so the guest asks again over TCP),
// and with EDNS the guest's size (at most 1232) is used; checks that the
// open path keeps the resolver's UDP bound.
func TestResolverOpenTruncatesForUDP(t *testing.T) {
	z := startZoneDNS(t, func(q, m *dns.Msg) {
		for i := range 120 {
			m.Answer = append(m.Answer, rr(t, fmt.Sprintf("%s 60 IN A 198.51.%d.%d", q.Question[0].Name, 100+i/100, i%100+1)))
		}
	})
	res, _ := openResolver(t, z, nil)
	for _, tc := range []struct {
		edns  uint16
		bound int
	}{{0, 512}, {4096, 1232}, {900, 900}} {
		m := new(dns.Msg)
		m.SetQuestion("big.example.", dns.TypeA)
		if tc.edns != 0 {
			m.SetEdns0(tc.edns, true)
		}
		q, _ := m.Pack()
		out := res.answer(context.Background(), "vnetc", netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.10.3.100"), q, 512)
		var a dns.Msg
		if err := a.Unpack(out); err != nil {
			t.Fatalf("edns %d: %v", tc.edns, err)
		}
		if len(out) > tc.bound || !a.Truncated || len(a.Answer) == 0 || len(a.Answer) == 120 {
			t.Errorf("edns %d: %d bytes, TC %v, %d answers; want at most %d bytes, TC, part of the 120", tc.edns, len(out), a.Truncated, len(a.Answer), tc.bound)
		}
		t.Logf("edns %d: %d bytes, %d answers, TC %v, OPT %v", tc.edns, len(out), len(a.Answer), a.Truncated, a.IsEdns0())
	}
}

// TestResolverOpenCraftedQueries: what an open guest may send that the
// zone's dnsmasq never sees: other opcodes (NOTIFY, UPDATE), several
// questions, another class (CHAOS: version.bind, servers.bind); all
// REFUSED without a question to the dnsmasq.
func TestResolverOpenCraftedQueries(t *testing.T) {
	z := startZoneDNS(t, func(q, m *dns.Msg) {})
	res, _ := openResolver(t, z, nil)
	msgs := map[string]*dns.Msg{}
	m := new(dns.Msg)
	m.SetNotify("example.")
	msgs["notify"] = m
	m = new(dns.Msg)
	m.SetUpdate("example.")
	msgs["update"] = m
	m = new(dns.Msg)
	m.SetQuestion("a.example.", dns.TypeA)
	m.Question = append(m.Question, dns.Question{Name: "b.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	msgs["two questions"] = m
	m = new(dns.Msg)
	m.SetQuestion("servers.bind.", dns.TypeTXT)
	m.Question[0].Qclass = dns.ClassCHAOS
	msgs["chaos"] = m
	for name, m := range msgs {
		q, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		var a dns.Msg
		if err := a.Unpack(res.answer(context.Background(), "vnetc", netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.10.3.100"), q, 512)); err != nil || a.Rcode != dns.RcodeRefused {
			t.Errorf("%s: %v %s, want REFUSED", name, err, dns.RcodeToString[a.Rcode])
		}
	}
	if n := len(z.questions()); n != 0 {
		t.Errorf("the zone's dnsmasq was asked %d times", n)
	}
}

// TestResolverOpenEchoesEDNS (found by review): RFC 6891 section 7 (a
// request with an OPT gets a response with one, over TCP and for an EDNS
// size of 512 or less too) and RFC 3225 section 3 (the DO bit of the
// query is copied into the response), so that a validating stub does not
// take the server for DNSSEC-unaware.
func TestResolverOpenEchoesEDNS(t *testing.T) {
	z := startZoneDNS(t, func(q, m *dns.Msg) {
		m.Answer = append(m.Answer, rr(t, q.Question[0].Name+" 60 IN A 203.0.113.10"))
	})
	res, _ := openResolver(t, z, nil)
	for _, tc := range []struct {
		name string
		edns uint16
		size int
	}{{"udp 1232", 1232, 512}, {"udp 512", 512, 512}, {"tcp", 1232, dns.MaxMsgSize}} {
		m := new(dns.Msg)
		m.SetQuestion("a.example.", dns.TypeA)
		m.SetEdns0(tc.edns, true)
		q, _ := m.Pack()
		var a dns.Msg
		if err := a.Unpack(res.answer(context.Background(), "vnetc", netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.10.3.100"), q, tc.size)); err != nil {
			t.Fatal(err)
		}
		if opt := a.IsEdns0(); opt == nil || !opt.Do() {
			t.Errorf("%s: a DO query's answer has OPT %v, want one with DO", tc.name, opt)
		}
		if q := z.questions(); len(q) == 0 || q[len(q)-1].IsEdns0() == nil || !q[len(q)-1].IsEdns0().Do() {
			t.Errorf("%s: the dnsmasq was not asked with DO", tc.name)
		}
	}
}
