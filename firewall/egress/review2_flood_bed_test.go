package egress

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestReview2ResolverFloodBelowPolicer (review2, issue 34 finding 5 /
// "other zones' DNS under a guest flood"): TestEgressOwnersOnBed floods
// the resolver at 500 queries a second; the guard lets one guest
// interface send 50000 packets a second (guest-flood-rate). All zones'
// queries share one UDP socket and its one read loop: the per-owner share
// is taken only after the kernel queued the datagram, so zone A at a rate
// the guard allows fills the socket's receive queue and zone B's queries
// are dropped by the kernel before any owner check (RcvbufErrors).
func TestReview2ResolverFloodBelowPolicer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	allow := Policy{Mode: "allowlist", Allow: []string{"*." + testvm.InternetName, testvm.InternetName}}
	s := newStackWith(t, ctx, allow, stackConfig{})
	for _, z := range []string{"zonea", "zoneb"} {
		if got, err := s.resolve(z, testvm.InternetName, s.gw[z]+":53", false); err != nil || len(got) != 1 {
			t.Fatalf("%s: resolve before the flood: %v, %v", z, got, err)
		}
	}
	rcvErr := func() string {
		b, err := exec.Command("ip", "netns", "exec", s.b.NodeNS(), "cat", "/proc/net/snmp").Output()
		if err != nil {
			return err.Error()
		}
		lines := strings.Split(string(b), "\n")
		for i, l := range lines {
			if strings.HasPrefix(l, "Udp: ") && i+1 < len(lines) {
				return l + " | " + lines[i+1]
			}
		}
		return ""
	}
	before := rcvErr()
	// A: 4 senders, 8000 queries a second each (32000/s, under the
	// guard's 50000/s policer), names that are refused (NXDOMAIN, no
	// upstream) so each costs the resolver little
	const senders, perSender = 6, 8000
	stop := make(chan struct{})
	var sent atomic.Int64
	var wg sync.WaitGroup
	for i := range senders {
		var c net.Conn
		if err := s.b.Do(s.guests["zonea"].NS, func() (err error) {
			c, err = net.Dial("udp4", s.gw["zonea"]+":53")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			m := new(dns.Msg)
			m.SetQuestion(fmt.Sprintf("x%d.flood.invalid.", i), dns.TypeA)
			b, _ := m.Pack()
			const batch = 80 // per 10 ms
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				for range batch * perSender / 8000 {
					if _, err := c.Write(b); err == nil {
						sent.Add(1)
					}
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	var lost, slow int
	var worst time.Duration
	const asks = 20
	for range asks {
		start := time.Now()
		err := s.b.Do(s.guests["zoneb"].NS, func() error {
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(testvm.InternetName), dns.TypeA)
			_, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, s.gw["zoneb"]+":53")
			return err
		})
		d := time.Since(start)
		time.Sleep(200 * time.Millisecond)
		worst = max(worst, d)
		if err != nil {
			lost++
		} else if d > 200*time.Millisecond {
			slow++
		}
	}
	close(stop)
	wg.Wait()
	after := rcvErr()
	t.Logf("zonea sent %d queries; zoneb: %d of %d lost (1 s timeout), %d slower than 200 ms, worst %s", sent.Load(), lost, asks, slow, worst)
	t.Logf("node Udp before: %s", before)
	t.Logf("node Udp after:  %s", after)
	if lost > 0 || slow > asks/10 {
		t.Errorf("zone B's DNS out of service while zone A floods at a rate the guard lets through: %d lost, %d slow of %d", lost, slow, asks)
	}
}
