package probe

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// probeBed is a network namespace with listeners the probe tests aim at.
type probeBed struct {
	ns                    *testkit.NetNS
	tcp4, tcp6            string // open TCP listeners
	http4, http6, https4  string // HTTP(S) servers (testkit.Handler)
	mute4                 string // accepts TCP, never speaks
	dns4, dns6            string // stand-in resolvers
	dropPort, refusedPort string // nft drops this port; nothing listens on that one
}

func newProbeBed(t *testing.T) *probeBed {
	t.Helper()
	ns := testkit.NewNetNS(t, "pip")
	ns.IP(t, "link", "add", "dummy0", "type", "veth", "peer", "name", "dummy1")
	ns.IP(t, "link", "set", "dummy1", "up")
	ns.IP(t, "link", "set", "dummy0", "up")
	ns.IP(t, "addr", "add", "10.99.0.1/24", "dev", "dummy0")
	ns.IP(t, "route", "add", "unreachable", "198.51.100.0/24")
	ns.IP(t, "route", "add", "prohibit", "198.18.0.0/24")
	// Nothing answers ARP behind dummy0: a default route through it is a black hole.
	ns.IP(t, "route", "add", "default", "via", "10.99.0.254", "dev", "dummy0")
	ns.NFT(t, `table inet probetest {
	chain input {
		type filter hook input priority 0; policy accept;
		tcp dport 9 drop
		udp dport 9 drop
	}
}
`)
	b := &probeBed{ns: ns, dropPort: "9", refusedPort: "1"}
	b.tcp4 = ns.Listen(t, "tcp4", "127.0.0.1:0").Addr().String()
	b.tcp6 = ns.Listen(t, "tcp6", "[::1]:0").Addr().String()
	l := ns.Listen(t, "tcp4", "127.0.0.1:0")
	testkit.ServeHTTP(t, l)
	b.http4 = l.Addr().String()
	l = ns.Listen(t, "tcp6", "[::1]:0")
	testkit.ServeHTTP(t, l)
	b.http6 = l.Addr().String()
	l = ns.Listen(t, "tcp4", "127.0.0.1:0")
	testkit.ServeHTTPS(t, l)
	b.https4 = l.Addr().String()
	mute := ns.Listen(t, "tcp4", "127.0.0.1:0")
	b.mute4 = mute.Addr().String()
	zone := testkit.DNSZone{
		A: map[string][]netip.Addr{"ok.test": {netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11"), netip.MustParseAddr("2001:db8::10")},
			"local.test": {netip.MustParseAddr("127.0.0.1")}},
		Refused: []string{"refused.test"},
		Silent:  []string{"silent.test"},
	}
	pc := ns.ListenPacket(t, "udp4", "127.0.0.1:0")
	testkit.ServeDNS(t, pc, zone)
	b.dns4 = pc.LocalAddr().String()
	pc = ns.ListenPacket(t, "udp6", "[::1]:0")
	testkit.ServeDNS(t, pc, zone)
	b.dns6 = pc.LocalAddr().String()
	return b
}

func TestProbeOutcomes(t *testing.T) {
	b := newProbeBed(t)
	const short = 700
	cases := []struct {
		t       Target
		outcome Outcome
		status  int
		rcode   string
		answers int
		detail  string // substring of Detail
	}{
		{t: Target{Kind: KindTCP, Addr: b.tcp4}, outcome: OutcomeOpen},
		{t: Target{Kind: KindTCP, Addr: b.tcp6}, outcome: OutcomeOpen},
		{t: Target{Kind: KindTCP, Addr: "127.0.0.1:" + b.refusedPort}, outcome: OutcomeRefused, detail: "refused"},
		{t: Target{Kind: KindTCP, Addr: "[::1]:" + b.refusedPort}, outcome: OutcomeRefused},
		{t: Target{Kind: KindTCP, Addr: "127.0.0.1:" + b.dropPort, TimeoutMS: short}, outcome: OutcomeTimeout},
		{t: Target{Kind: KindTCP, Addr: "[::1]:" + b.dropPort, TimeoutMS: short}, outcome: OutcomeTimeout},
		{t: Target{Kind: KindTCP, Addr: "203.0.113.99:80", TimeoutMS: short}, outcome: OutcomeTimeout}, // black-holed default route
		{t: Target{Kind: KindTCP, Addr: "198.51.100.7:80"}, outcome: OutcomeUnreachable, detail: "no route"},
		{t: Target{Kind: KindTCP, Addr: "198.18.0.7:80"}, outcome: OutcomeUnreachable},
		{t: Target{Kind: KindTCP, Addr: "[2001:db8::1]:80"}, outcome: OutcomeUnreachable}, // no IPv6 route at all
		{t: Target{Kind: KindHTTP, Addr: b.http4, Path: "/latest/meta-data/instance-id"}, outcome: OutcomeResponse, status: 200},
		{t: Target{Kind: KindHTTP, Addr: b.http4, Path: "/status/404"}, outcome: OutcomeResponse, status: 404},
		{t: Target{Kind: KindHTTP, Addr: b.http4, Path: "/status/503"}, outcome: OutcomeResponse, status: 503},
		{t: Target{Kind: KindHTTP, Addr: b.http4, Path: "/status/302"}, outcome: OutcomeResponse, status: 302}, // not followed
		{t: Target{Kind: KindHTTP, Addr: b.http4, Method: "PUT", Path: "/latest/api/token", Headers: map[string]string{testkit.TokenHeader: "21600"}}, outcome: OutcomeResponse, status: 200},
		{t: Target{Kind: KindHTTP, Addr: b.http4, Method: "PUT", Path: "/latest/api/token"}, outcome: OutcomeResponse, status: 400},
		{t: Target{Kind: KindHTTP, Addr: b.http6, Path: "/status/204"}, outcome: OutcomeResponse, status: 204},
		{t: Target{Kind: KindHTTPS, Addr: b.https4, Path: "/status/201"}, outcome: OutcomeResponse, status: 201},
		{t: Target{Kind: KindHTTPS, Addr: b.http4, TimeoutMS: short}, outcome: OutcomeOpen, detail: "connected"}, // TLS to plain HTTP
		{t: Target{Kind: KindHTTP, Addr: b.mute4, TimeoutMS: short}, outcome: OutcomeOpen, detail: "connected"},
		{t: Target{Kind: KindHTTP, Addr: "127.0.0.1:" + b.refusedPort}, outcome: OutcomeRefused},
		{t: Target{Kind: KindHTTP, Addr: "127.0.0.1:" + b.dropPort, TimeoutMS: short}, outcome: OutcomeTimeout},
		{t: Target{Kind: KindHTTP, Addr: "198.51.100.7:80"}, outcome: OutcomeUnreachable},
		{t: Target{Kind: KindDNS, Addr: b.dns4, Name: "ok.test"}, outcome: OutcomeResponse, rcode: "NOERROR", answers: 2},
		{t: Target{Kind: KindDNS, Addr: b.dns4, Name: "ok.test.", QType: "AAAA"}, outcome: OutcomeResponse, rcode: "NOERROR", answers: 1},
		{t: Target{Kind: KindDNS, Addr: b.dns6, Name: "OK.test"}, outcome: OutcomeResponse, rcode: "NOERROR", answers: 2},
		{t: Target{Kind: KindDNS, Addr: b.dns4, Name: "missing.test"}, outcome: OutcomeResponse, rcode: "NXDOMAIN"},
		{t: Target{Kind: KindDNS, Addr: b.dns4, Name: "refused.test"}, outcome: OutcomeResponse, rcode: "REFUSED"},
		{t: Target{Kind: KindDNS, Addr: b.dns4, Name: "silent.test", TimeoutMS: short}, outcome: OutcomeNoReply},
		{t: Target{Kind: KindDNS, Addr: "127.0.0.1:" + b.dropPort, Name: "ok.test", TimeoutMS: short}, outcome: OutcomeNoReply},
		{t: Target{Kind: KindDNS, Addr: "127.0.0.1:" + b.refusedPort, Name: "ok.test"}, outcome: OutcomeRefused},
		{t: Target{Kind: KindDNS, Addr: "198.51.100.7:53", Name: "ok.test"}, outcome: OutcomeUnreachable},
		// a name resolved first, then HTTPS to its address with that name (or another) as SNI
		{t: Target{Kind: KindHTTPS, Addr: "0.0.0.0:" + port(b.https4), Name: "local.test", Resolver: b.dns4, Path: "/status/201"}, outcome: OutcomeResponse, status: 201},
		{t: Target{Kind: KindHTTPS, Addr: "0.0.0.0:" + port(b.https4), Name: "local.test", Resolver: b.dns4, Host: "other.test", Path: "/status/202"}, outcome: OutcomeResponse, status: 202},
		{t: Target{Kind: KindHTTPS, Addr: "0.0.0.0:" + port(b.https4), Name: "missing.test", Resolver: b.dns4}, outcome: OutcomeNoReply, detail: "NameError"},
	}
	req := &Request{Version: Version, Concurrency: 8}
	for i := range cases {
		cases[i].t.ID = "t" + strconv.Itoa(i)
		req.Targets = append(req.Targets, cases[i].t)
	}
	if err := ValidateRequest(req); err != nil {
		t.Fatal(err)
	}
	p := &Prober{Dialer: b.ns, Root: filepath.Join("testdata", "root")}
	rep := p.Run(context.Background(), req)
	if len(rep.Results) != len(cases) {
		t.Fatalf("%d results for %d targets", len(rep.Results), len(cases))
	}
	for i, c := range cases {
		r := rep.Results[i]
		name := string(c.t.Kind) + " " + c.t.Method + " " + c.t.Addr + c.t.Path + c.t.Name
		if r.ID != c.t.ID {
			t.Errorf("%s: id %q, want %q", name, r.ID, c.t.ID)
		}
		if r.Outcome != c.outcome || r.HTTPStatus != c.status || r.RCode != c.rcode || r.Answers != c.answers {
			t.Errorf("%s: got %s status=%d rcode=%q answers=%d (%s), want %s status=%d rcode=%q answers=%d",
				name, r.Outcome, r.HTTPStatus, r.RCode, r.Answers, r.Detail, c.outcome, c.status, c.rcode, c.answers)
		}
		if c.detail != "" && !strings.Contains(r.Detail, c.detail) {
			t.Errorf("%s: detail %q lacks %q", name, r.Detail, c.detail)
		}
	}
	// What the probe prints must pass the host's strict parser.
	if _, err := ParseReport(mustJSON(t, rep)); err != nil {
		t.Fatalf("own report rejected: %v", err)
	}
}

func TestReadFactsFixture(t *testing.T) {
	f := ReadFacts(filepath.Join("testdata", "root"))
	if f.DefaultRoute4 == nil || *f.DefaultRoute4 != (Route{Iface: "eth0", Gateway: "10.10.1.1"}) {
		t.Errorf("default route4 = %+v, want eth0 via 10.10.1.1", f.DefaultRoute4)
	}
	if f.DefaultRoute6 == nil || *f.DefaultRoute6 != (Route{Iface: "eth0", Gateway: "fe80::1"}) {
		t.Errorf("default route6 = %+v, want eth0 via fe80::1", f.DefaultRoute6)
	}
	if strings.Join(f.Resolvers, ",") != "10.10.1.1,fd00::1" {
		t.Errorf("resolvers = %v", f.Resolvers)
	}
	if len(f.Errors) != 0 {
		t.Errorf("errors = %v", f.Errors)
	}
	empty := ReadFacts(t.TempDir())
	if empty.DefaultRoute4 != nil || len(empty.Errors) != 1 || len(empty.Resolvers) != 0 {
		t.Errorf("empty root: route4=%v errors=%v resolvers=%v, want none, 1 error (no /proc/net/route), none", empty.DefaultRoute4, empty.Errors, empty.Resolvers)
	}
}

// countingDialer blocks every dial until its context ends and records the
// highest number of dials in flight.
type countingDialer struct {
	mu        sync.Mutex
	cur, peak int
}

func (d *countingDialer) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	d.mu.Lock()
	d.cur++
	d.peak = max(d.peak, d.cur)
	d.mu.Unlock()
	<-ctx.Done()
	d.mu.Lock()
	d.cur--
	d.mu.Unlock()
	return nil, ctx.Err()
}

func TestConcurrencyBound(t *testing.T) {
	for _, n := range []int{1, 3, 8} {
		d := &countingDialer{}
		req := &Request{Version: Version, Concurrency: n}
		for i := range 12 {
			req.Targets = append(req.Targets, Target{ID: "t" + strconv.Itoa(i), Kind: KindTCP, Addr: "192.0.2.1:80", TimeoutMS: 30})
		}
		rep := (&Prober{Dialer: d, Root: t.TempDir()}).Run(context.Background(), req)
		if d.peak != n {
			t.Errorf("concurrency %d: peak %d dials in flight", n, d.peak)
		}
		for _, r := range rep.Results {
			if r.Outcome != OutcomeTimeout {
				t.Errorf("concurrency %d: %s = %s, want timeout", n, r.ID, r.Outcome)
			}
		}
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := &Request{Version: Version, Concurrency: 1, Targets: []Target{
		{ID: "a", Kind: KindTCP, Addr: "192.0.2.1:80"}, {ID: "b", Kind: KindTCP, Addr: "192.0.2.1:81"},
	}}
	rep := (&Prober{Dialer: &countingDialer{}, Root: t.TempDir()}).Run(ctx, req)
	for _, r := range rep.Results {
		if r.Outcome != OutcomeError {
			t.Errorf("%s = %s after cancel, want error (no verdict)", r.ID, r.Outcome)
		}
	}
	if _, err := ParseReport(mustJSON(t, rep)); err != nil {
		t.Fatal(err)
	}
}

func TestWithZone(t *testing.T) {
	for _, c := range []struct{ in, zone, want string }{
		{"[fe80::a9fe:a9fe]:80", "eth0", "[fe80::a9fe:a9fe%eth0]:80"},
		{"[fe80::1%ens18]:80", "eth0", "[fe80::1%ens18]:80"},
		{"[fd00:ec2::254]:80", "eth0", "[fd00:ec2::254]:80"},
		{"169.254.169.254:80", "eth0", "169.254.169.254:80"},
		{"[fe80::1]:80", "", "[fe80::1]:80"},
	} {
		if got := withZone(c.in, c.zone); got != c.want {
			t.Errorf("withZone(%q, %q) = %q, want %q", c.in, c.zone, got, c.want)
		}
	}
}

func TestClip(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 10, "abc"},
		{"abcdef", 3, "abc"},
		{"a\nb\x00c", 10, "a?b?c"},
		{"é\u0085x", 10, "é?x"},
		{"ééé", 5, "éé"}, // never cuts a rune
		{"a\xffb", 10, "a?b"},
	} {
		got := clip(c.in, c.n)
		if got != c.want {
			t.Errorf("clip(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
		if err := cleanText(got, c.n); err != nil {
			t.Errorf("clip(%q) output rejected by cleanText: %v", c.in, err)
		}
	}
}

func TestTimeoutDefault(t *testing.T) {
	// A target without a timeout gets DefaultTimeout: the dial context carries it.
	var got time.Duration
	d := dialerFunc(func(ctx context.Context, _, _ string) (net.Conn, error) {
		dl, _ := ctx.Deadline()
		got = time.Until(dl)
		return nil, context.Canceled
	})
	(&Prober{Dialer: d, Root: t.TempDir()}).Run(context.Background(), &Request{Version: Version, Targets: []Target{{ID: "a", Kind: KindTCP, Addr: "192.0.2.1:80"}}})
	if got <= 0 || got > DefaultTimeout*time.Millisecond {
		t.Errorf("deadline %v from now, want within (0, %dms]", got, DefaultTimeout)
	}
}

type dialerFunc func(ctx context.Context, network, address string) (net.Conn, error)

func (f dialerFunc) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return f(ctx, network, address)
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// TestRunBoundCutIsNoVerdict: a row still waiting when the run's own
// bound ends it (main's deadline: RunBound plus RunGrace, so the report
// comes back before the host's exec timeout) is an error, never a
// timeout: silence cut short is no proof the path is blocked.
func TestRunBoundCutIsNoVerdict(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req := &Request{Version: Version, Targets: []Target{{ID: "slow", Kind: KindTCP, Addr: "192.0.2.1:80", TimeoutMS: 5000}}}
	rep := (&Prober{Dialer: &countingDialer{}, Root: t.TempDir()}).Run(ctx, req)
	if r := rep.Results[0]; r.Outcome != OutcomeError || !strings.Contains(r.Detail, "not finished") {
		t.Fatalf("a row cut by the run's bound: %s %q, want error (not finished)", r.Outcome, r.Detail)
	}
}

// stuckDialer blocks every dial until release, whatever its context: a
// call the row's context does not reach.
type stuckDialer struct{ release chan struct{} }

func (d stuckDialer) DialContext(context.Context, string, string) (net.Conn, error) {
	<-d.release
	return nil, errors.New("released")
}

// TestRunCutsStuckRows: rows that do not end by the run's context's end
// are cut: Run still reports (each such row an error saying so, never a
// verdict), and the late results are dropped.
func TestRunCutsStuckRows(t *testing.T) {
	d := stuckDialer{release: make(chan struct{})}
	defer close(d.release)
	req := &Request{Version: Version, Concurrency: 2}
	for i := range 3 {
		req.Targets = append(req.Targets, Target{ID: "t" + strconv.Itoa(i), Kind: KindTCP, Addr: "192.0.2.1:80", TimeoutMS: 30})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var progress strings.Builder
	rep := (&Prober{Dialer: d, Root: t.TempDir(), Progress: &progress}).Run(ctx, req)
	if len(rep.Results) != 3 {
		t.Fatalf("%d results", len(rep.Results))
	}
	for _, r := range rep.Results {
		if r.Outcome != OutcomeError || (!strings.HasPrefix(r.Detail, "cut:") && !strings.HasPrefix(r.Detail, "not run:")) {
			t.Errorf("%s = %s %q, want an error: cut or not run", r.ID, r.Outcome, r.Detail)
		}
	}
	if !strings.Contains(progress.String(), "rows cut at the bound") {
		t.Errorf("progress %q", progress.String())
	}
}
