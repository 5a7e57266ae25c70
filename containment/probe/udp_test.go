package probe

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// serveUDP answers each datagram on pc with reply(datagram) (nil: no
// answer) until the test ends.
func serveUDP(t *testing.T, pc net.PacketConn, reply func([]byte) []byte) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return // closed at cleanup
			}
			if out := reply(buf[:n]); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); wg.Wait() })
}

// ntpReply answers an NTP client request (mode 3) with a server reply
// (mode 4) and nothing else.
func ntpReply(req []byte) []byte {
	if len(req) != 48 || req[0]&0x07 != 3 {
		return nil
	}
	reply := make([]byte, 48)
	reply[0] = 0x24                // version 4, mode 4 (server)
	copy(reply[24:32], req[40:48]) // origin = the client's transmit
	return reply
}

// TestUDPOutcomes aims the probe, from a client namespace, at a server
// namespace behind a veth: a DNS server and an NTP server that answer the
// probe's payloads, a silent service, a closed port, an address whose UDP
// is dropped and one whose UDP is rejected as administratively prohibited;
// plus a closed port on the client's loopback (the self-check control).
func TestUDPOutcomes(t *testing.T) {
	cl := testkit.NewNetNS(t, "puc")
	sv := testkit.NewNetNS(t, "pus")
	cl.IP(t, "link", "add", "vc", "type", "veth", "peer", "name", "vs", "netns", sv.Name)
	cl.IP(t, "addr", "add", "10.98.0.1/24", "dev", "vc")
	cl.IP(t, "addr", "add", "fd98::1/64", "dev", "vc", "nodad")
	cl.IP(t, "link", "set", "vc", "up")
	for _, a := range []string{"10.98.0.2/24", "10.98.0.3/24", "10.98.0.4/24"} {
		sv.IP(t, "addr", "add", a, "dev", "vs")
	}
	sv.IP(t, "addr", "add", "fd98::2/64", "dev", "vs", "nodad")
	sv.IP(t, "link", "set", "vs", "up")
	sv.NFT(t, `table inet udptest {
	chain input {
		type filter hook input priority 0; policy accept;
		ip daddr 10.98.0.3 meta l4proto udp drop
		ip daddr 10.98.0.4 meta l4proto udp reject with icmp type admin-prohibited
	}
}
`)
	testkit.ServeDNS(t, sv.ListenPacket(t, "udp4", "10.98.0.2:53"), testkit.DNSZone{})
	serveUDP(t, sv.ListenPacket(t, "udp4", "10.98.0.2:123"), ntpReply)
	serveUDP(t, sv.ListenPacket(t, "udp4", "10.98.0.2:161"), func([]byte) []byte { return nil }) // a silent service

	cases := []struct {
		addr, payload string
		outcome       Outcome
		canary        Outcome
		detail        string
	}{
		{"10.98.0.2:53", PayloadDNS, OutcomeReply, OutcomeRefused, "bytes back"},
		{"10.98.0.2:123", PayloadNTP, OutcomeReply, OutcomeRefused, "48 bytes back"},
		{"10.98.0.2:161", "", OutcomeNoReply, OutcomeRefused, "no reply"},             // silent service: the canary proves delivery
		{"10.98.0.2:5405", "", OutcomeRefused, OutcomeRefused, "port unreachable"},    // closed: the host said so
		{"10.98.0.2:124", PayloadNTP, OutcomeRefused, OutcomeRefused, "unreachable"},  // NTP payload to a closed port
		{"[fd98::2]:5405", "", OutcomeRefused, OutcomeRefused, "port unreachable"},    // the same over IPv6
		{"10.98.0.3:123", PayloadNTP, OutcomeNoReply, OutcomeNoReply, "no reply"},     // dropped: silence everywhere
		{"10.98.0.4:5405", "", OutcomeUnreachable, OutcomeUnreachable, "unreachable"}, // admin-prohibited
		{"127.0.0.1:9", "", OutcomeRefused, OutcomeRefused, "port unreachable"},       // the self-check
	}
	req := &Request{Version: Version, Concurrency: 4}
	for i, c := range cases {
		req.Targets = append(req.Targets, Target{ID: "u" + strconv.Itoa(i), Kind: KindUDP, Addr: c.addr, Payload: c.payload, TimeoutMS: 2400})
	}
	if err := ValidateRequest(req); err != nil {
		t.Fatal(err)
	}
	rep := (&Prober{Dialer: cl, Root: t.TempDir()}).Run(context.Background(), req)
	for i, c := range cases {
		r := rep.Results[i]
		if r.Outcome != c.outcome || r.Canary != c.canary || !strings.Contains(r.Detail, c.detail) {
			t.Errorf("udp %s (%q): %s canary %s (%s), want %s canary %s (detail with %q)",
				c.addr, c.payload, r.Outcome, r.Canary, r.Detail, c.outcome, c.canary, c.detail)
		}
	}
	if _, err := ParseReport(mustJSON(t, rep)); err != nil {
		t.Fatalf("own report rejected: %v", err)
	}
}

// TestUDPCanaryOncePerAddress: targets on one address share one canary
// (the first sends it, the others wait for its result), so a host's ICMP
// rate limit is spent on the canary first.
func TestUDPCanaryOncePerAddress(t *testing.T) {
	var mu sync.Mutex
	dials := map[string]int{}
	d := dialerFunc(func(ctx context.Context, network, address string) (net.Conn, error) {
		mu.Lock()
		dials[address]++
		mu.Unlock()
		return nil, &net.OpError{Op: "dial", Err: errors.New("connection refused: " + address)}
	})
	req := &Request{Version: Version, Concurrency: 8}
	for i, p := range []string{"53", "123", "161", "5405"} {
		req.Targets = append(req.Targets, Target{ID: "u" + strconv.Itoa(i), Kind: KindUDP, Addr: "10.0.0.1:" + p, TimeoutMS: 300})
	}
	rep := (&Prober{Dialer: d, Root: t.TempDir()}).Run(context.Background(), req)
	canaryDials := 0
	for a, n := range dials {
		if port, _ := strconv.Atoi(a[strings.LastIndexByte(a, ':')+1:]); port >= canaryPortMin {
			canaryDials += n
		}
	}
	if canaryDials != 1 {
		t.Errorf("%d canary dials for one address, want 1: %v", canaryDials, dials)
	}
	for _, r := range rep.Results {
		if r.Canary == "" {
			t.Errorf("%s: no canary result", r.ID)
		}
	}
}

func TestUDPPayloads(t *testing.T) {
	b, err := udpPayload(PayloadDNS)
	if err != nil {
		t.Fatal(err)
	}
	var m dnsmessage.Message
	if err := m.Unpack(b); err != nil || m.Response || len(m.Questions) != 1 || m.Questions[0].Type != dnsmessage.TypeNS || m.RecursionDesired {
		t.Errorf("dns payload %x: %v %+v, want one non-recursive NS query", b, err, m.Header)
	}
	b, err = udpPayload(PayloadNTP)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 48 || b[0] != 0x23 || bytes.Equal(b[40:], make([]byte, 8)) {
		t.Errorf("ntp payload %x: want 48 bytes, version 4 mode 3, a transmit timestamp", b)
	}
	if b, _ := udpPayload(PayloadGeneric); len(b) == 0 {
		t.Error("empty generic payload")
	}
}

func TestValidateUDPTarget(t *testing.T) {
	cases := []struct {
		t  Target
		ok bool
	}{
		{Target{ID: "a", Kind: KindUDP, Addr: "10.0.0.1:123", Payload: PayloadNTP}, true},
		{Target{ID: "a", Kind: KindUDP, Addr: "[fd00::1]:53", Payload: PayloadDNS}, true},
		{Target{ID: "a", Kind: KindUDP, Addr: "10.0.0.1:5405"}, true},
		{Target{ID: "a", Kind: KindUDP, Addr: "10.0.0.1:5405", Payload: "snmp"}, false},
		{Target{ID: "a", Kind: KindUDP, Addr: "10.0.0.1:53", Name: "x.test"}, false},
		{Target{ID: "a", Kind: KindUDP, Addr: "10.0.0.1:0"}, false},
		{Target{ID: "a", Kind: KindTCP, Addr: "10.0.0.1:22", Payload: PayloadDNS}, false},
		{Target{ID: "a", Kind: KindDNS, Addr: "10.0.0.1:53", Name: "x.test", Payload: PayloadDNS}, false},
	}
	for _, c := range cases {
		err := ValidateRequest(&Request{Version: Version, Targets: []Target{c.t}})
		if (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok=%v", c.t, err, c.ok)
		}
	}
}

func TestParseReportCanary(t *testing.T) {
	for _, c := range []struct {
		json string
		ok   bool
	}{
		{`{"version":1,"facts":{"interfaces":[],"resolvers":[]},"results":[{"id":"a","outcome":"reply","canary":"refused","elapsed_ms":1}]}`, true},
		{`{"version":1,"facts":{"interfaces":[],"resolvers":[]},"results":[{"id":"a","outcome":"no_reply","canary":"no_reply","elapsed_ms":1}]}`, true},
		{`{"version":1,"facts":{"interfaces":[],"resolvers":[]},"results":[{"id":"a","outcome":"no_reply","canary":"open","elapsed_ms":1}]}`, false},
		{`{"version":1,"facts":{"interfaces":[],"resolvers":[]},"results":[{"id":"a","outcome":"reply","canary":"refused","Canary":"reply","elapsed_ms":1}]}`, false},
		{`{"version":1,"facts":{"interfaces":[],"resolvers":[]},"results":[{"id":"a","outcome":"reply","rcode":"NOERROR","elapsed_ms":1}]}`, false},
	} {
		_, err := ParseReport([]byte(c.json))
		if (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok=%v", c.json, err, c.ok)
		}
	}
}

func TestCanaryPhase(t *testing.T) {
	req := &Request{Version: Version, Targets: []Target{
		{ID: "a", Kind: KindTCP, Addr: "10.0.0.1:22", TimeoutMS: 9000},
		{ID: "b", Kind: KindUDP, Addr: "10.0.0.1:53", TimeoutMS: 2000},
		{ID: "c", Kind: KindUDP, Addr: "10.0.0.1:123", TimeoutMS: 2500},
	}}
	if got := CanaryPhase(req); got != 2500*time.Millisecond {
		t.Errorf("one address: %v, want the longest udp timeout", got)
	}
	req.Targets = req.Targets[:1]
	if got := CanaryPhase(req); got != 0 {
		t.Errorf("no udp: %v", got)
	}
	for i := range MaxConcurrency + 1 {
		req.Targets = append(req.Targets, Target{ID: "u" + strconv.Itoa(i), Kind: KindUDP, Addr: "10.1.0." + strconv.Itoa(i+1) + ":53"})
	}
	if got := CanaryPhase(req); got != 2*DefaultTimeout*time.Millisecond {
		t.Errorf("%d addresses: %v, want two rounds of the default timeout", MaxConcurrency+1, got)
	}
}
