package egress

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestEgressDNSFloodPolicedOnBed: all zones' queries share the
// resolver's one UDP socket and its one read loop, and the per-owner share
// is taken only after the kernel queued the datagram; under the guard's
// packet policer alone (50000/s per interface) zone A could fill the
// socket's receive queue and zone B's queries were dropped by the kernel
// before any owner check (RcvbufErrors). The guard's per-interface DNS
// policer (guest-dns-rate-udp, 500/s burst 1000) cuts zone A's flood
// before the redirect: zone A floods as fast as its guest can send, and
// zone B loses nothing.
func TestEgressDNSFloodPolicedOnBed(t *testing.T) {
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
	// A: senders writing as fast as they can (each write a query), names
	// that are refused (NXDOMAIN, no upstream) so each costs the resolver
	// little
	const senders = 4
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
			for {
				select {
				case <-stop:
					return
				default:
				}
				for range 100 {
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
	policed := dnsPoliced(t, s.b.NodeNS())
	t.Logf("zonea queries dropped by the guard's DNS policer: %d", policed)
	if lost > 0 || slow > asks/10 {
		t.Errorf("zone B's DNS out of service while zone A floods: %d lost, %d slow of %d", lost, slow, asks)
	}
	// the rest of the flood meets guest-flood-rate (50000/s) first, or
	// never leaves the guest's queue
	if sent.Load() < 5000 || policed < 5000 || policed < sent.Load()/10 {
		t.Errorf("zone A sent %d queries, the DNS policer dropped %d: the flood did not meet the policer", sent.Load(), policed)
	}
}

// dnsPoliced is the packet counter of the guard's rule guest-dns-rate-udp
// in the node namespace ns.
func dnsPoliced(t *testing.T, ns string) int64 {
	t.Helper()
	b, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "chain", "inet", firewall.TableName, "prerouting").Output()
	if err != nil {
		t.Fatalf("nft list: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, `comment "guest-dns-rate-udp"`) {
			continue
		}
		f := strings.Fields(l)
		for i := range f[:len(f)-2] {
			if f[i] == "counter" && f[i+1] == "packets" {
				n, err := strconv.ParseInt(f[i+2], 10, 64)
				if err != nil {
					t.Fatalf("counter in %q: %v", l, err)
				}
				return n
			}
		}
	}
	t.Fatalf("no guest-dns-rate-udp counter in:\n%s", b)
	return 0
}
