package egress

import (
	"context"
	"fmt"
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

// zoneDNS is a stand-in for a zone's dnsmasq on 127.0.0.1 (UDP and TCP,
// one port): it answers from its table and remembers every question.
type zoneDNS struct {
	addr string // host:port of both listeners

	mu    sync.Mutex
	asked []dns.Msg
}

func startZoneDNS(t *testing.T, answer func(q *dns.Msg, m *dns.Msg)) *zoneDNS {
	t.Helper()
	z := &zoneDNS{}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", pc.LocalAddr().String())
	if err != nil {
		_ = pc.Close()
		t.Fatal(err)
	}
	z.addr = pc.LocalAddr().String()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		z.mu.Lock()
		z.asked = append(z.asked, *q.Copy())
		z.mu.Unlock()
		m := new(dns.Msg)
		m.SetReply(q)
		answer(q, m)
		if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
			m.Truncate(512)
		}
		_ = w.WriteMsg(m)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		go func() { _ = srv.ActivateAndServe() }()
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return z
}

func (z *zoneDNS) questions() []dns.Msg {
	z.mu.Lock()
	defer z.mu.Unlock()
	return slices.Clone(z.asked)
}

// TestResolverOpenForwardsUnchanged: an open zone's question (which the
// guard redirects only when it was sent to the zone's own address) is
// asked of the zone's resolver at that address, port 53, whatever its
// type; the answer comes back as that resolver gave it (records of every
// type, authority, rcode, a long answer over TCP); nothing is learned, so
// a learned-address quota of one refuses nothing; and each question is
// in the sandbox's record with its answer. The upstream is never asked.
func TestResolverOpenForwardsUnchanged(t *testing.T) {
	many := make([]string, 40)
	for i := range many {
		many[i] = fmt.Sprintf("big.example. 60 IN A 198.51.100.%d", i+1)
	}
	z := startZoneDNS(t, func(q, m *dns.Msg) {
		qq := q.Question[0]
		add := func(s ...string) {
			for _, x := range s {
				m.Answer = append(m.Answer, rr(t, x))
			}
		}
		switch strings.ToLower(qq.Name) + dns.TypeToString[qq.Qtype] {
		case "pypi.org.A":
			add("pypi.org. 300 IN A 203.0.113.10", "pypi.org. 300 IN A 203.0.113.11")
		case "pypi.org.AAAA":
			add("pypi.org. 300 IN AAAA 2001:db8::10")
		case "tunnel.evil.org.TXT":
			add(`tunnel.evil.org. 0 IN TXT "payload"`)
		case "big.example.A":
			add(many...)
		default:
			m.Rcode = dns.RcodeNameError
			m.Ns = []dns.RR{rr(t, "org. 900 IN SOA a.org. h.org. 1 2 3 4 5")}
		}
	})
	_, port, _ := net.SplitHostPort(z.addr)
	local := netip.MustParseAddr("127.0.0.1")
	var dialed []string
	var dmu sync.Mutex
	dial := func(ctx context.Context, network, address string) (net.Conn, error) {
		dmu.Lock()
		dialed = append(dialed, network+" "+address)
		dmu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
	}

	g := newFakeGuard()
	none, _ := Compile(Policy{Mode: "none"})
	reg := NewRegistry(g, none, nil, WithMaxLearned(1))
	open, _ := Compile(Policy{Mode: "open"})
	if err := reg.Set(context.Background(), "zc", "sb-open", []string{"vnetc"}, open); err != nil {
		t.Fatal(err)
	}
	up := &fakeUpstream{}
	elog := NewLog(LogConfig{PerOwner: 64})
	res := NewResolver(ResolverConfig{Dial: dial, Timeout: 2 * time.Second, Log: elog}, reg, nil, NewDenials(), up, slog.New(slog.DiscardHandler))

	cases := []struct {
		name    string
		qname   string
		qtype   uint16
		size    int
		rcode   int
		answers []string // the answer section, in presentation form
		ns      int
	}{
		{name: "A", qname: "PyPI.org.", qtype: dns.TypeA, size: 512, rcode: dns.RcodeSuccess,
			answers: []string{"pypi.org.\t300\tIN\tA\t203.0.113.10", "pypi.org.\t300\tIN\tA\t203.0.113.11"}},
		{name: "AAAA answered, not emptied", qname: "pypi.org.", qtype: dns.TypeAAAA, size: 512, rcode: dns.RcodeSuccess,
			answers: []string{"pypi.org.\t300\tIN\tAAAA\t2001:db8::10"}},
		{name: "TXT forwarded (open mode has no tunnel to close)", qname: "tunnel.evil.org.", qtype: dns.TypeTXT, size: 512, rcode: dns.RcodeSuccess,
			answers: []string{"tunnel.evil.org.\t0\tIN\tTXT\t\"payload\""}},
		{name: "NXDOMAIN with its authority", qname: "nothing.org.", qtype: dns.TypeA, size: 512, rcode: dns.RcodeNameError, ns: 1},
		{name: "a long answer over TCP, all of it", qname: "big.example.", qtype: dns.TypeA, size: dns.MaxMsgSize, rcode: dns.RcodeSuccess,
			answers: func() []string {
				var out []string
				for _, s := range many {
					out = append(out, rr(t, s).String())
				}
				return out
			}()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := res.answer(context.Background(), "vnetc", local, netip.MustParseAddr("10.10.3.100"), query(t, tc.qname, tc.qtype), tc.size)
			var m dns.Msg
			if err := m.Unpack(out); err != nil {
				t.Fatalf("answer does not parse: %v", err)
			}
			if m.Rcode != tc.rcode || m.Question[0].Name != tc.qname {
				t.Errorf("rcode %s question %s, want %s %s", dns.RcodeToString[m.Rcode], m.Question[0].Name, dns.RcodeToString[tc.rcode], tc.qname)
			}
			var got []string
			for _, a := range m.Answer {
				got = append(got, a.String())
			}
			if !slices.Equal(got, tc.answers) {
				t.Errorf("answers %q, want %q", got, tc.answers)
			}
			if len(m.Ns) != tc.ns {
				t.Errorf("authority %v, want %d records", m.Ns, tc.ns)
			}
			asked := z.questions()
			last := asked[len(asked)-1].Question[0]
			if last.Name != tc.qname || last.Qtype != tc.qtype {
				t.Errorf("the zone resolver was asked %v, want %s %s", last, tc.qname, dns.TypeToString[tc.qtype])
			}
		})
	}
	dmu.Lock()
	for _, d := range dialed {
		if !strings.HasSuffix(d, " 127.0.0.1:53") {
			t.Errorf("dialed %s, want the zone's own address, port 53", d)
		}
	}
	dmu.Unlock()
	if q := up.queries(); len(q) != 0 {
		t.Errorf("the upstream was asked %v", q)
	}
	if len(g.learned["vnetc"]) != 0 {
		t.Errorf("learned %v for an open zone", g.learned["vnetc"])
	}
	recs := elog.Read("sb-open", LogQuery{Type: RecordDNS}).Records
	if len(recs) != len(cases) {
		t.Fatalf("%d DNS records, want %d: %+v", len(recs), len(cases), recs)
	}
	for i, tc := range cases {
		r := recs[i]
		if r.Name != strings.ToLower(strings.TrimSuffix(tc.qname, ".")) || r.QType != dns.TypeToString[tc.qtype] ||
			r.Verdict != VerdictAnswered || r.Rcode != dns.RcodeToString[tc.rcode] || r.Guest.Addr != netip.MustParseAddr("10.10.3.100") {
			t.Errorf("record %d: %+v, want %s %s answered %s", i, r, tc.qname, dns.TypeToString[tc.qtype], dns.RcodeToString[tc.rcode])
		}
	}
	if a := recs[0].Answers; len(a) != 2 || a[0] != netip.MustParseAddr("203.0.113.10") {
		t.Errorf("record answers %v", a)
	}

	// no zone address (a query the guard did not redirect to one): a
	// failure, recorded, and nothing asked anywhere
	n := len(z.questions())
	var m dns.Msg
	if err := m.Unpack(res.Answer(context.Background(), "vnetc", query(t, "pypi.org.", dns.TypeA), 512)); err != nil || m.Rcode != dns.RcodeServerFailure {
		t.Errorf("without a zone address: %v %v, want SERVFAIL", dns.RcodeToString[m.Rcode], err)
	}
	if len(z.questions()) != n || len(up.queries()) != 0 {
		t.Error("a question without a zone address was asked somewhere")
	}
	if recs := elog.Read("sb-open", LogQuery{Type: RecordDNS}).Records; recs[len(recs)-1].Verdict != VerdictFailed {
		t.Errorf("last record %+v, want failed", recs[len(recs)-1])
	}
}
