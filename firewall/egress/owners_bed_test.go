package egress

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// floodDNS sends zone's guest's slow queries to its resolver, one every
// 2ms, until stop is closed; it returns how many it sent.
func (s *stack) floodDNS(t *testing.T, zone string, stop <-chan struct{}) <-chan int {
	t.Helper()
	var c net.Conn
	if err := s.b.Do(s.guests[zone].NS, func() (err error) {
		c, err = net.Dial("udp4", s.gw[zone]+":53")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	sent := make(chan int, 1)
	go func() {
		defer c.Close()
		n := 0
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				sent <- n
				return
			case <-tick.C:
			}
			m := new(dns.Msg)
			m.SetQuestion(fmt.Sprintf("slow.f%d.%s.", n, testvm.InternetName), dns.TypeA)
			b, _ := m.Pack()
			if _, err := c.Write(b); err == nil {
				n++
			}
		}
	}()
	return sent
}

// TestEgressOwnersOnBed is issue 34 finding 5 on the bed: owner A floods
// the resolver (a query every 2ms for slow names, far past its share of
// queries in flight) and the proxy (more connections than its share, the
// ones it got held spliced), and owner B's DNS answer and proxied
// connection still work, as do a sandbox's. A and B are zones the daemon
// did not create (under the node default): they shared one owner
// ("node-default"), so A's flood took B's quota and B's DNS and proxy
// were refused. A's refusals are counted for A alone, and none of them
// took a unit of a node total.
//
// No clock decides it: B and C ask once A holds its whole share and has
// had 100 queries refused, with the resolver's upstream Timeout 2 minutes
// (A's slow queries hold their slots for 4), and their one query must be
// answered within a minute. A query dropped for A's quota, or answered
// only when a slot of A's came free, gets no answer within it.
func TestEgressOwnersOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const dnsShare, proxyShare = 4, 3
	inet := testvm.InternetAddr
	allow := Policy{Mode: "allowlist", Allow: []string{"*." + testvm.InternetName, testvm.InternetName}}
	up := &slowUpstream{addr: inet}
	s := newStackWith(t, ctx, allow, stackConfig{up: up,
		resolver: ResolverConfig{QueriesPerOwner: dnsShare, Timeout: 2 * time.Minute}, proxy: ProxyConfig{ConnsPerOwner: proxyShare}})
	s.set(t, ctx, "zonec", allow) // a sandbox of the daemon's: owner sb-zonec
	for _, z := range []string{"zonea", "zoneb", "zonec"} {
		if got, err := s.resolve(z, testvm.InternetName, s.gw[z]+":53", false); err != nil || len(got) != 1 {
			t.Fatalf("%s: resolve before the flood: %v, %v", z, got, err)
		}
	}
	ownerA, ownerB := DefaultOwnerOf("zonea", ""), DefaultOwnerOf("zoneb", "")

	// A takes its share of the proxy, spliced and held; the rest refused
	var held []*keepAlive
	defer func() {
		for _, k := range held {
			_ = k.c.Close()
		}
	}()
	for range proxyShare + 5 {
		k, err := s.keepAlive("zonea", inet+":80")
		if err != nil {
			continue // refused so fast that the reset met the connect
		}
		if body, err := k.get(testvm.InternetName); err != nil || body != "internet host" {
			_ = k.c.Close()
			continue
		}
		held = append(held, k)
	}
	if len(held) != proxyShare {
		t.Errorf("zonea holds %d proxied connections, want its share %d", len(held), proxyShare)
	}
	// A floods its resolver while B and C are served
	stop := make(chan struct{})
	sent := s.floodDNS(t, "zonea", stop)
	// B and C ask once zonea is past its share: its slow queries hold
	// every slot of its share and 100 more were refused
	refusedA := func() float64 {
		return testutil.ToFloat64(s.den.refused.WithLabelValues(ownerA, ResourceDNSUDP, LimitOwner))
	}
	if r := waitCount(refusedA, 100); r < 100 {
		t.Fatalf("zonea's flood: %v queries refused within a minute", r)
	}
	if mine, _ := s.res.queries.inUse(ownerA); mine != dnsShare {
		t.Fatalf("zonea holds %d queries in flight during its flood, want its share %d", mine, dnsShare)
	}
	var wg sync.WaitGroup
	for _, z := range []string{"zoneb", "zonec"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// one query, answered within a minute: zonea's slow queries
			// hold their slots for 2 x Timeout, 4 minutes, so an answer
			// that waited for one of them (or a query dropped for
			// zonea's quota) is no answer
			if got, err := s.resolveWithin(z, testvm.InternetName, s.gw[z]+":53", false, time.Minute); err != nil || len(got) != 1 {
				t.Errorf("%s during zonea's flood: DNS %v, %v", z, got, err)
			}
			if body, err := s.get(z, "http://"+testvm.InternetName+"/", inet+":80"); err != nil || body != "internet host" {
				t.Errorf("%s during zonea's flood: proxied connection %q, %v", z, body, err)
			}
		}()
	}
	wg.Wait()
	_, queriesInFlight := s.res.queries.inUse(ownerA)
	close(stop)
	n := <-sent
	if n < 100 {
		t.Fatalf("zonea sent only %d queries", n)
	}
	if a := up.slowAsked(); a > dnsShare*3 {
		t.Errorf("%d of zonea's slow queries reached the upstream, share %d at once", a, dnsShare)
	}
	// what A was refused is counted for A, per resource, by its own
	// limit; it held no node unit past its share
	// the resolver counts a refusal as it reads the query, which on a
	// loaded machine may be after the flood stopped: wait for the counts
	if r := waitCount(refusedA, float64(n)/2); r < float64(n)/2 {
		t.Errorf("zonea's DNS refusals counted: %v of %d sent", r, n)
	}
	if r := waitCount(func() float64 {
		return testutil.ToFloat64(s.den.refused.WithLabelValues(ownerA, ResourceProxy, LimitOwner))
	}, 1); r < 1 {
		t.Errorf("zonea's proxy refusals counted: %v", r)
	}
	if queriesInFlight > dnsShare+2 {
		t.Errorf("%d queries in flight node-wide during zonea's flood, zonea's share is %d", queriesInFlight, dnsShare)
	}
	for _, o := range []string{ownerB, "sb-zonec"} {
		for _, res := range []string{ResourceDNSUDP, ResourceProxy} {
			if r := testutil.ToFloat64(s.den.refused.WithLabelValues(o, res, LimitOwner)) + testutil.ToFloat64(s.den.refused.WithLabelValues(o, res, LimitNode)); r != 0 {
				t.Errorf("%s refused %v times (%s) during zonea's flood", o, r, res)
			}
		}
	}
}
