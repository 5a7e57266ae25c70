package egress

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// lossyUpstream is a UDP DNS server on loopback that drops the first
// datagram it gets for each query id and answers the rest, recording
// where every datagram came from.
type lossyUpstream struct {
	pc   net.PacketConn
	mu   sync.Mutex
	seen []string // "source id" of every datagram, in order
	drop int      // datagrams still to drop
}

func startLossyUpstream(t *testing.T, drop int) *lossyUpstream {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &lossyUpstream{pc: pc, drop: drop}
	done := make(chan struct{})
	t.Cleanup(func() { pc.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := new(dns.Msg)
			if q.Unpack(buf[:n]) != nil {
				continue
			}
			u.mu.Lock()
			u.seen = append(u.seen, fmt.Sprintf("%s %d", from, q.Id))
			dropIt := u.drop > 0
			if dropIt {
				u.drop--
			}
			u.mu.Unlock()
			if dropIt {
				continue
			}
			r := new(dns.Msg)
			r.SetReply(q)
			r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 7)})
			out, _ := r.Pack()
			_, _ = pc.WriteTo(out, from)
		}
	}()
	return u
}

func (u *lossyUpstream) datagrams() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

// TestUpstreamRetransmitsAsRetry: a query whose first datagram is lost is
// answered within the timeout, because the exchange sends it again from
// the same socket with the same id (what a forwarder such as dnsmasq
// takes as a retry and forwards again); a query lost twice fails at the
// timeout; a TCP exchange is never resent.
func TestUpstreamRetransmitsAsRetry(t *testing.T) {
	for _, tc := range []struct {
		name      string
		drop      int
		wantErr   bool
		datagrams int
	}{
		{"answered first time", 0, false, 1},
		{"first datagram lost", 1, false, 2},
		{"both lost", 2, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startLossyUpstream(t, tc.drop)
			var d net.Dialer
			u := &upstreams{addrs: []string{up.pc.LocalAddr().String()}, dial: d.DialContext, timeout: 600 * time.Millisecond}
			m := new(dns.Msg)
			m.SetQuestion("x.example.test.", dns.TypeA)
			in, err := u.Exchange(context.Background(), m)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("exchange answered %v, want a timeout", in)
				}
			} else if err != nil || len(in.Answer) != 1 {
				t.Fatalf("exchange: %v %v", in, err)
			}
			seen := up.datagrams()
			if len(seen) != tc.datagrams {
				t.Fatalf("upstream saw %d datagrams %v, want %d", len(seen), seen, tc.datagrams)
			}
			for _, s := range seen[1:] {
				if s != seen[0] {
					t.Errorf("resent query %q differs in source or id from the first %q: a forwarder would not take it as a retry", s, seen[0])
				}
			}
		})
	}
}
