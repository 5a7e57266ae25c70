package testkit

import (
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// TokenHeader is the IMDSv2 token TTL header the metadata stand-in requires on PUT.
const TokenHeader = "X-aws-ec2-metadata-token-ttl-seconds"

// Handler answers like a small metadata service and status echo:
// GET /latest/meta-data/instance-id → 200; PUT /latest/api/token → 200
// with TokenHeader, 400 without; /status/NNN → NNN; anything else → 200.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /latest/meta-data/instance-id", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("i-0123456789"))
	})
	mux.HandleFunc("PUT /latest/api/token", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(TokenHeader) == "" {
			http.Error(w, "missing "+TokenHeader, http.StatusBadRequest)
			return
		}
		_, _ = w.Write([]byte("token"))
	})
	mux.HandleFunc("/status/{code}", func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(r.PathValue("code"))
		if err != nil || code < 200 || code > 599 {
			code = http.StatusTeapot
		}
		w.WriteHeader(code)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	return mux
}

// ServeHTTP serves Handler on l until the test ends.
func ServeHTTP(tb testing.TB, l net.Listener) {
	tb.Helper()
	s := &http.Server{Handler: Handler()}
	go func() { _ = s.Serve(l) }()
	tb.Cleanup(func() { s.Close() })
}

// ServeHTTPS serves Handler over TLS with a throw-away self-signed
// certificate on l until the test ends.
func ServeHTTPS(tb testing.TB, l net.Listener) {
	tb.Helper()
	s := httptest.NewUnstartedServer(Handler())
	s.Listener.Close()
	s.Listener = l
	s.StartTLS()
	s.TLS.MinVersion = tls.VersionTLS12
	tb.Cleanup(s.Close)
}

// DNSZone says how the stand-in resolver answers: names (with or without
// the final dot) in A get those addresses; names in Refused get REFUSED;
// names in Silent get no reply at all; everything else NXDOMAIN.
type DNSZone struct {
	A       map[string][]netip.Addr
	Refused []string
	Silent  []string
}

// ServeDNS serves z on the packet socket until the test ends.
func ServeDNS(tb testing.TB, pc net.PacketConn, z DNSZone) {
	tb.Helper()
	fqdn := func(s string) string { return dns.Fqdn(strings.ToLower(s)) }
	a := map[string][]netip.Addr{}
	for k, v := range z.A {
		a[fqdn(k)] = v
	}
	refused, silent := map[string]bool{}, map[string]bool{}
	for _, n := range z.Refused {
		refused[fqdn(n)] = true
	}
	for _, n := range z.Silent {
		silent[fqdn(n)] = true
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		if len(q.Question) != 1 {
			return
		}
		qn := strings.ToLower(q.Question[0].Name)
		if silent[qn] {
			return
		}
		m := new(dns.Msg)
		m.SetReply(q)
		m.RecursionAvailable = true
		switch {
		case refused[qn]:
			m.Rcode = dns.RcodeRefused
		case a[qn] != nil:
			for _, ad := range a[qn] {
				if ad.Is4() && q.Question[0].Qtype == dns.TypeA {
					m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: ad.AsSlice()})
				}
				if ad.Is6() && q.Question[0].Qtype == dns.TypeAAAA {
					m.Answer = append(m.Answer, &dns.AAAA{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 60}, AAAA: ad.AsSlice()})
				}
			}
		default:
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})
	s := &dns.Server{PacketConn: pc, Handler: h}
	started := make(chan struct{})
	s.NotifyStartedFunc = func() { close(started) }
	errc := make(chan error, 1)
	go func() { errc <- s.ActivateAndServe() }()
	select {
	case <-started:
	case err := <-errc:
		tb.Fatalf("dns server: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Shutdown(); err != nil && !errors.Is(err, net.ErrClosed) {
			tb.Logf("dns server shutdown: %v", err)
		}
	})
}
