package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// seqs are the Seq of records.
func seqs(rs []Record) []uint64 {
	var out []uint64
	for _, r := range rs {
		out = append(out, r.Seq)
	}
	return out
}

// TestLogBounds: a ring keeps its last PerOwner records and counts what
// it dropped; past the node bound an owner's new record is dropped
// (counted) and never another owner's; a full ring still turns over.
func TestLogBounds(t *testing.T) {
	cases := []struct {
		name    string
		cfg     LogConfig
		adds    map[string]int // owner -> records added, in this order: a, b
		want    map[string][]uint64
		dropped map[string]uint64
		held    int
	}{
		{name: "ring turns over", cfg: LogConfig{PerOwner: 3, Node: 100},
			adds: map[string]int{"a": 5}, want: map[string][]uint64{"a": {3, 4, 5}}, dropped: map[string]uint64{"a": 2}, held: 3},
		{name: "node full: the flooding owner's own records are dropped, the other's kept", cfg: LogConfig{PerOwner: 4, Node: 5},
			adds: map[string]int{"b": 2, "a": 10}, want: map[string][]uint64{"a": {1, 2, 3}, "b": {1, 2}}, dropped: map[string]uint64{"a": 7}, held: 5},
		{name: "under every bound: nothing dropped", cfg: LogConfig{PerOwner: 4, Node: 8},
			adds: map[string]int{"a": 2, "b": 4}, want: map[string][]uint64{"a": {1, 2}, "b": {1, 2, 3, 4}}, held: 6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLog(tc.cfg)
			for _, o := range []string{"b", "a"} {
				for range tc.adds[o] {
					l.Open(o).Add(Record{Type: RecordDNS, Name: o + ".example"})
				}
			}
			for o, want := range tc.want {
				p := l.Read(o, LogQuery{})
				if !slices.Equal(seqs(p.Records), want) || p.Dropped != tc.dropped[o] {
					t.Errorf("%s: records %v dropped %d, want %v dropped %d", o, seqs(p.Records), p.Dropped, want, tc.dropped[o])
				}
			}
			if n := l.Held(); n != tc.held {
				t.Errorf("held %d, want %d", n, tc.held)
			}
		})
	}
}

// TestLogInstance: Forget drops an owner's records and a ring taken
// before it records nothing more; the owner's next instance starts empty
// at Seq 1; the node's room comes back.
func TestLogInstance(t *testing.T) {
	l := NewLog(LogConfig{PerOwner: 4, Node: 4})
	old := l.Open("sb-1")
	for range 4 {
		old.Add(Record{Type: RecordConn})
	}
	l.Forget("sb-1")
	old.Add(Record{Type: RecordConn, Name: "late.example"}) // a connection of the old instance ending
	if p := l.Read("sb-1", LogQuery{}); len(p.Records) != 0 || p.Dropped != 0 {
		t.Fatalf("after Forget: %+v", p)
	}
	if n := l.Held(); n != 0 {
		t.Errorf("held %d after Forget, want 0", n)
	}
	l.Open("sb-1").Add(Record{Type: RecordDNS, Name: "new.example"})
	p := l.Read("sb-1", LogQuery{})
	if len(p.Records) != 1 || p.Records[0].Seq != 1 || p.Records[0].Name != "new.example" {
		t.Errorf("new instance: %+v", p.Records)
	}
}

// TestLogRead: filters by type and VM, pages with Since and Limit.
func TestLogRead(t *testing.T) {
	l := NewLog(LogConfig{PerOwner: 16})
	r := l.Open("sb")
	for i := range 6 {
		typ := RecordDNS
		if i%2 == 1 {
			typ = RecordConn
		}
		r.Add(Record{Type: typ, Guest: Guest{VMID: 100 + i%3}})
	}
	cases := []struct {
		q    LogQuery
		want []uint64
		next uint64
		more bool
	}{
		{q: LogQuery{}, want: []uint64{1, 2, 3, 4, 5, 6}, next: 6},
		{q: LogQuery{Type: RecordConn}, want: []uint64{2, 4, 6}, next: 6},
		{q: LogQuery{VMID: 101}, want: []uint64{2, 5}, next: 5},
		{q: LogQuery{Limit: 2}, want: []uint64{1, 2}, next: 2, more: true},
		{q: LogQuery{Since: 2, Limit: 2}, want: []uint64{3, 4}, next: 4, more: true},
		{q: LogQuery{Since: 4, Limit: 2}, want: []uint64{5, 6}, next: 6},
		{q: LogQuery{Since: 6}, want: nil, next: 6},
	}
	for _, tc := range cases {
		p := l.Read("sb", tc.q)
		if !slices.Equal(seqs(p.Records), tc.want) || p.Next != tc.next || p.More != tc.more {
			t.Errorf("%+v: %v next %d more %v, want %v next %d more %v", tc.q, seqs(p.Records), p.Next, p.More, tc.want, tc.next, tc.more)
		}
	}
}

// TestLogDroppedWithRegistry: the record goes with the instance the
// registry ends (Remove, Begin) through OnDrop, as the daemon wires it;
// an answer decided under the removed instance is not recorded.
func TestLogDroppedWithRegistry(t *testing.T) {
	ctx := context.Background()
	f := newResolverFixture(t)
	log := NewLog(LogConfig{})
	f.res.cfg.Log = log
	f.res.reg.OnDrop(func(_, owner string) { log.Forget(owner) })
	f.res.Answer(ctx, "vneta", query(t, "pypi.org.", dns.TypeA), 512)
	if n := len(log.Read("sb-allow", LogQuery{}).Records); n != 1 {
		t.Fatalf("%d records before the drop, want 1", n)
	}
	_, _, gen, _ := f.res.reg.ForGen("vneta")
	allow, _ := Compile(Policy{Mode: "allowlist", Allow: []string{"pypi.org"}})
	for _, end := range []func() error{
		func() error { return f.res.reg.Begin(ctx, "za", "sb-allow", []string{"vneta"}, allow) },
		func() error { return f.res.reg.Remove(ctx, "za") },
	} {
		if err := end(); err != nil {
			t.Fatal(err)
		}
		if p := log.Read("sb-allow", LogQuery{}); len(p.Records) != 0 {
			t.Errorf("records after the instance ended: %+v", p.Records)
		}
	}
	openRing(f.res.reg, log, "vneta", gen, 0, "sb-allow").Add(Record{Type: RecordDNS})
	if n := log.Held(); n != 0 {
		t.Errorf("a record of the removed instance was kept: %d", n)
	}
}

type mapGuests map[netip.Addr]Guest

func (m mapGuests) GuestOf(a netip.Addr) (Guest, bool) {
	g, ok := m[a]
	return g, ok
}

// TestResolverRecords: each question answered for a guest is recorded
// in its owner's ring, with its verdict, reason, answers and VM.
func TestResolverRecords(t *testing.T) {
	src := netip.MustParseAddr("10.10.1.100")
	vm := Guest{Addr: src, VMID: 101, MAC: "bc:24:11:00:00:01"}
	cases := []struct {
		name, iface, qname string
		qtype              uint16
		owner              string
		want               Record
	}{
		{name: "allowed", iface: "vneta", qname: "PyPI.org.", qtype: dns.TypeA, owner: "sb-allow",
			want: Record{Type: RecordDNS, Name: "pypi.org", QType: "A", Verdict: VerdictAnswered, Rcode: "NOERROR",
				Answers: []netip.Addr{netip.MustParseAddr("203.0.113.10")}, Guest: vm}},
		{name: "refused name", iface: "vneta", qname: "tunnel.evil.org.", qtype: dns.TypeTXT, owner: "sb-allow",
			want: Record{Type: RecordDNS, Name: "tunnel.evil.org", QType: "TXT", Verdict: VerdictRefused, Reason: ReasonName, Rcode: "NXDOMAIN", Guest: vm}},
		{name: "allowed name, AAAA", iface: "vneta", qname: "pypi.org.", qtype: dns.TypeAAAA, owner: "sb-allow",
			want: Record{Type: RecordDNS, Name: "pypi.org", QType: "AAAA", Verdict: VerdictAnswered, Rcode: "NOERROR", Guest: vm}},
		{name: "none mode", iface: "vnetz", qname: "pypi.org.", qtype: dns.TypeA, owner: DefaultOwnerOf("", "vnetz"),
			want: Record{Type: RecordDNS, Name: "pypi.org", QType: "A", Verdict: VerdictRefused, Reason: ReasonMode, Rcode: "NXDOMAIN", Guest: vm}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newResolverFixture(t)
			f.res.cfg.Log, f.res.cfg.Guests = NewLog(LogConfig{}), mapGuests{src: vm}
			f.res.answer(context.Background(), tc.iface, netip.Addr{}, src, query(t, tc.qname, tc.qtype), 512)
			p := f.res.cfg.Log.Read(tc.owner, LogQuery{})
			if len(p.Records) != 1 {
				t.Fatalf("records %+v, want one", p.Records)
			}
			got := p.Records[0]
			if got.Time.IsZero() {
				t.Error("no time")
			}
			got.Seq, got.Time = 0, time.Time{}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("record\n %+v\nwant\n %+v", got, tc.want)
			}
		})
	}
}

// TestProxyRecords: each connection the proxy handles is recorded with
// its destination, checked name, verdict and the bytes each way, and
// its VM; a refusal at once.
func TestProxyRecords(t *testing.T) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte(strings.Repeat("x", 1000)))
	}), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	reg := NewRegistry(newFakeGuard(), Rules{Mode: firewall.EgressNone}, nil)
	allow, _ := Compile(Policy{Mode: "allowlist", Allow: []string{"pypi.org"}})
	if err := reg.Set(context.Background(), "za", "sb-allow", []string{"vneta"}, allow); err != nil {
		t.Fatal(err)
	}
	dst := netip.MustParseAddrPort("203.0.113.10:80")
	cases := []struct {
		name, host string
		body       int
		want       Record
		bytesIn    bool
	}{
		{name: "allowed host", host: "pypi.org", body: 300,
			want: Record{Type: RecordConn, Proto: "tcp", Dest: dst, Name: "pypi.org", Check: "host", Verdict: VerdictAllowed}, bytesIn: true},
		{name: "refused host", host: "evil.org", body: 0,
			want: Record{Type: RecordConn, Proto: "tcp", Dest: dst, Name: "evil.org", Check: "host", Verdict: VerdictRefused, Reason: ReasonHost}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			log := NewLog(LogConfig{})
			dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp4", ln.Addr().String())
			}
			p := NewProxy(ProxyConfig{Dial: dial, Log: log, PeekTimeout: 5 * time.Second}, reg, nil, NewDenials(), slog.New(slog.DiscardHandler))
			guest, proxySide := tcpPair(t)
			src := addrOf(guest.LocalAddr())
			p.cfg.Guests = mapGuests{src: {Addr: src, VMID: 101, MAC: "bc:24:11:00:00:01"}}
			done := make(chan struct{})
			go func() {
				defer close(done)
				p.serve(context.Background(), proxySide, "vneta", dst)
				_ = proxySide.Close()
			}()
			req := fmt.Sprintf("POST / HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", tc.host, tc.body, strings.Repeat("y", tc.body))
			if _, err := guest.Write([]byte(req)); err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(bufio.NewReader(guest))
			_ = guest.Close()
			<-done
			pg := log.Read("sb-allow", LogQuery{})
			if len(pg.Records) != 1 {
				t.Fatalf("records %+v, want one", pg.Records)
			}
			rec := pg.Records[0]
			if rec.Guest.VMID != 101 || rec.Guest.Addr != src {
				t.Errorf("guest %+v", rec.Guest)
			}
			if tc.bytesIn {
				if rec.BytesOut != int64(len(req)) || rec.BytesIn != int64(len(got)) || rec.BytesIn < 1000 {
					t.Errorf("bytes out %d in %d, want %d and %d", rec.BytesOut, rec.BytesIn, len(req), len(got))
				}
			} else if rec.BytesOut != 0 || rec.BytesIn != 0 {
				t.Errorf("a refused connection relayed bytes: out %d in %d", rec.BytesOut, rec.BytesIn)
			}
			want := tc.want
			want.Seq, want.Time, want.Guest, want.BytesOut, want.BytesIn, want.Duration = rec.Seq, rec.Time, rec.Guest, rec.BytesOut, rec.BytesIn, rec.Duration
			if fmt.Sprint(rec) != fmt.Sprint(want) {
				t.Errorf("record\n %+v\nwant\n %+v", rec, want)
			}
		})
	}
}

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return client, server
}

// TestResolverRecordsNameBounded: a question's name is recorded as the
// resolver reads it (presentation form, each byte outside printable
// ASCII escaped as \DDD), so a 255-octet name of such bytes is 1003
// characters; the record keeps at most maxRecordName bytes of it, cut
// between two characters of the name (never inside an escape) and marked
// with an ellipsis, which no name in presentation form has. A name of
// 253 characters is kept whole.
func TestResolverRecordsNameBounded(t *testing.T) {
	esc := strings.Repeat(`\255`, 63)
	valid := strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61)
	// a backslash at the end, or one and fewer than three digits, not
	// itself escaped: the kept part ends inside an escape
	partial := regexp.MustCompile(`(?:^|[^\\])(?:\\\\)*\\[0-9]{0,2}$`)
	cases := []struct {
		name, qname string
		keep        int // bytes of the name kept before the mark; 0: whole
	}{
		{name: "253 characters: whole", qname: valid + "."},
		{name: "255 octets of escapes: cut at an escape", qname: esc + "." + esc + "." + esc + "." + strings.Repeat(`\255`, 61) + ".", keep: 248},
		{name: "the bound inside an escape: cut before it", qname: strings.Repeat("a", 60) + `\.` + "." + esc + "." + esc + "." + esc + ".", keep: 247},
		{name: "the bound between escaped backslashes", qname: strings.Repeat(`\\`, 63) + "." + strings.Repeat(`\\`, 63) + "." + esc + ".", keep: 249},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newResolverFixture(t)
			f.res.cfg.Log = NewLog(LogConfig{})
			f.res.answer(context.Background(), "vneta", netip.Addr{}, netip.Addr{}, query(t, tc.qname, dns.TypeA), 512)
			p := f.res.cfg.Log.Read("sb-allow", LogQuery{})
			if len(p.Records) != 1 {
				t.Fatalf("records %+v, want one", p.Records)
			}
			got, full := p.Records[0].Name, strings.TrimSuffix(tc.qname, ".")
			if tc.keep == 0 {
				if got != full {
					t.Errorf("name %q, want %q", got, full)
				}
				return
			}
			kept, marked := strings.CutSuffix(got, "…")
			if !marked || len(got) > maxRecordName || len(kept) != tc.keep || !strings.HasPrefix(full, kept) || partial.MatchString(kept) {
				t.Errorf("name of %d bytes %q: want the question's first %d bytes, whole characters, marked …, at most %d bytes", len(got), got, tc.keep, maxRecordName)
			}
		})
	}
}
