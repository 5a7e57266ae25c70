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
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// The tests of this file are issue 24's findings, each shown the way a
// hostile root guest would try it on the bed. Every one fails on the code
// before the fix (the comment of each says how) and uses only
// what that code had, so it can be run against it.

// serveUplink answers on addr (inside the internet host's namespace):
// tcp with greeting on every connection, udp by echoing each datagram.
func (s *stack) serveUplink(t *testing.T, network, addr, greeting string) {
	t.Helper()
	if network == "udp4" {
		var pc net.PacketConn
		if err := s.b.Do(s.b.UplinkNS(), func() (err error) {
			pc, err = net.ListenPacket(network, addr)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pc.Close() })
		go func() {
			buf := make([]byte, 1500)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo(buf[:n], from)
			}
		}()
		return
	}
	var ln net.Listener
	if err := s.b.Do(s.b.UplinkNS(), func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, greeting)
			_ = c.Close()
		}
	}()
}

// reach reports whether zone's guest gets an answer from addr: the
// greeting of a tcp service, or an echo of a udp datagram shaped like a
// QUIC Initial's first byte.
func (s *stack) reach(zone, network, addr string) (bool, string) {
	var got string
	err := s.b.Do(s.guests[zone].NS, func() error {
		c, err := net.DialTimeout(network, addr, 1500*time.Millisecond)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if network == "udp4" {
			if _, err := c.Write([]byte{0xc0, 0, 0, 0, 1, 'q', 'u', 'i', 'c'}); err != nil {
				return err
			}
		}
		buf := make([]byte, 64)
		n, err := c.Read(buf)
		got = string(buf[:n])
		return err
	})
	return err == nil && got != "", fmt.Sprintf("%q, %v", got, err)
}

// TestEgressLearnedAddressOpensOnlyCheckedPortsOnBed is issue 24's main
// finding: a learned address used to open every port and protocol (the
// forward rule let all of @egress_learned4 through), so after resolving
// an allowed name a guest reached tcp 8443 and 22 and QUIC on udp 443 of
// its address with no name checked. Now an allowed name opens tcp 80/443
// of its addresses through the Host/SNI check only, a name:port entry
// that one tcp port by address, a CIDR everything. On the old code the
// rows "after resolving" of zonea answer (and zoneb's name:port policy
// does not compile).
func TestEgressLearnedAddressOpensOnlyCheckedPortsOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStack(t, ctx, Policy{Mode: "open"})
	inet := testvm.InternetAddr
	s.serveUplink(t, "tcp4", inet+":8443", "tls-8443\n")
	s.serveUplink(t, "tcp4", inet+":22", "SSH-2.0-bed\n")
	s.serveUplink(t, "udp4", inet+":443", "")
	s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	s.set(t, ctx, "zonec", Policy{Mode: "allowlist", Allow: []string{inet + "/32"}})
	type row struct {
		zone, network, addr string
		want                bool
	}
	check := func(when string, rows []row) {
		t.Helper()
		for _, r := range rows {
			if got, detail := s.reach(r.zone, r.network, r.addr); got != r.want {
				t.Errorf("%s: %s %s %s: reached=%v (%s), want %v", when, r.zone, r.network, r.addr, got, detail, r.want)
			}
		}
	}
	check("before resolving", []row{
		{"zonea", "tcp4", inet + ":8443", false},
		{"zonea", "udp4", inet + ":443", false},
	})
	if got, err := s.resolve("zonea", testvm.InternetName, s.gw["zonea"]+":53", false); err != nil || len(got) != 1 || got[0] != inet {
		t.Fatalf("zonea: resolve the allowed name: %v, %v", got, err)
	}
	check("after resolving", []row{
		{"zonea", "tcp4", inet + ":8443", false}, // another TLS port of a CDN: no name check there
		{"zonea", "tcp4", inet + ":22", false},
		{"zonea", "udp4", inet + ":443", false}, // QUIC: dropped, clients fall back to TCP
		{"zonec", "tcp4", inet + ":8443", true}, // a CIDR opens everything
		{"zonec", "tcp4", inet + ":22", true},
		{"zonec", "udp4", inet + ":443", true},
	})
	// a name:port entry opens that tcp port by address, nothing else
	s.set(t, ctx, "zoneb", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName + ":22"}})
	check("name:22, before resolving", []row{{"zoneb", "tcp4", inet + ":22", false}})
	if got, err := s.resolve("zoneb", testvm.InternetName, s.gw["zoneb"]+":53", false); err != nil || len(got) != 1 || got[0] != inet {
		t.Fatalf("zoneb: resolve the name of a name:port entry: %v, %v", got, err)
	}
	check("name:22, after resolving", []row{
		{"zoneb", "tcp4", inet + ":22", true},
		{"zoneb", "tcp4", inet + ":8443", false},
		{"zoneb", "udp4", inet + ":22", false},
		{"zoneb", "udp4", inet + ":443", false},
	})
	// the checked ports still work for the allowed name, and only for it
	if body, err := s.get("zonea", "https://"+testvm.InternetName+"/", inet+":443"); err != nil || body != "internet host" {
		t.Errorf("zonea: allowed name over HTTPS: %q, %v", body, err)
	}
	if body, err := s.getBlocked("zonea", "https://other."+testvm.InternetName+"/", inet+":443"); err == nil {
		t.Errorf("zonea: wrong SNI on the allowed address: %q", body)
	}
	// a name:port entry does not allow the name through the name check
	if body, err := s.getBlocked("zoneb", "https://"+testvm.InternetName+"/", inet+":443"); err == nil {
		t.Errorf("zoneb (only %s:22): HTTPS to the name: %q", testvm.InternetName, body)
	}
}

// keepAlive is an HTTP/1.1 connection from a guest, kept open.
type keepAlive struct {
	c  net.Conn
	br *bufio.Reader
}

func (s *stack) keepAlive(zone, addr string) (*keepAlive, error) {
	var c net.Conn
	if err := s.b.Do(s.guests[zone].NS, func() (err error) {
		c, err = net.DialTimeout("tcp4", addr, 1500*time.Millisecond)
		return err
	}); err != nil {
		return nil, err
	}
	return &keepAlive{c: c, br: bufio.NewReader(c)}, nil
}

// get sends one request for host on the kept connection and reads the
// answer's body.
func (k *keepAlive) get(host string) (string, error) {
	_ = k.c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(k.c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return strings.TrimSpace(string(b)), err
}

// TestEgressChangeClosesProxiedConnectionsOnBed is finding 1: a keep-alive
// connection spliced by the proxy survived a change of the zone's policy
// (its upstream socket is the daemon's, never a forwarded flow). Now the
// change closes it before Set returns. On the old code the request after
// the change is answered.
func TestEgressChangeClosesProxiedConnectionsOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStack(t, ctx, Policy{Mode: "open"})
	inet := testvm.InternetAddr
	s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	s.set(t, ctx, "zoneb", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	for _, z := range []string{"zonea", "zoneb"} {
		if got, err := s.resolve(z, testvm.InternetName, s.gw[z]+":53", false); err != nil || len(got) != 1 {
			t.Fatalf("%s: resolve: %v, %v", z, got, err)
		}
	}
	conns := map[string]*keepAlive{}
	for _, z := range []string{"zonea", "zoneb"} {
		k, err := s.keepAlive(z, inet+":80")
		if err != nil {
			t.Fatal(err)
		}
		defer k.c.Close()
		if body, err := k.get(testvm.InternetName); err != nil || body != "internet host" {
			t.Fatalf("%s: first request: %q, %v", z, body, err)
		}
		conns[z] = k
	}
	s.set(t, ctx, "zonea", Policy{Mode: "none"})
	if body, err := conns["zonea"].get(testvm.InternetName); err == nil {
		t.Errorf("a keep-alive connection from before the change to none still answers: %q", body)
	}
	// the other zone's connection is not touched
	if body, err := conns["zoneb"].get(testvm.InternetName); err != nil || body != "internet host" {
		t.Errorf("zoneb's connection after zonea's change: %q, %v", body, err)
	}
}

// gatedUpstream answers every A query with addr, once released.
type gatedUpstream struct {
	addr    string
	asked   chan struct{}
	release chan struct{}
	once    sync.Once
}

func (u *gatedUpstream) Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	u.once.Do(func() { close(u.asked) })
	select {
	case <-u.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r := new(dns.Msg)
	r.SetReply(m)
	r.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 3600},
		A: net.ParseIP(u.addr)}}
	return r, nil
}

// learnedMembers lists the node's learned sets (those that exist).
func (s *stack) learnedMembers(t *testing.T) string {
	t.Helper()
	var out []string
	for _, set := range []string{"egress_learned4", "egress_learned_ports4"} {
		b, err := s.b.Command(context.Background(), s.b.NodeNS(), "nft", "list", "set", "inet", "pve-inspect", set).CombinedOutput()
		if err != nil && strings.Contains(string(b), "No such file") {
			continue
		}
		if err != nil {
			t.Fatalf("list %s: %v: %s", set, err, b)
		}
		out = append(out, string(b))
	}
	return strings.Join(out, "")
}

// TestEgressAnswerInFlightNotLearnedAfterChangeOnBed is finding 2 (first
// half): a DNS answer in flight during a policy change was learned after
// it (Answer took the rules, waited upstream, then learned with no check
// of which policy is current), re-opening for an hour an address of a
// name the new policy removed. On the old code the address is in the
// learned set after the answer.
func TestEgressAnswerInFlightNotLearnedAfterChangeOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStack(t, ctx, Policy{Mode: "open"})
	s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	node, err := netns.GetFromName(s.b.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	links, err := NewNetlinkLinks(node)
	if err != nil {
		t.Fatal(err)
	}
	defer links.Close()
	up := &gatedUpstream{addr: testvm.InternetAddr, asked: make(chan struct{}), release: make(chan struct{})}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	res := NewResolver(ResolverConfig{TTLFloor: time.Hour, TTLCeiling: time.Hour}, s.reg, links, s.den, up, log)
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(testvm.InternetName), dns.TypeA)
	wire, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	answered := make(chan []byte, 1)
	go func() { answered <- res.Answer(ctx, s.bridge["zonea"], wire, 512) }()
	select {
	case <-up.asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the query never reached the upstream")
	}
	s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{"other.test"}})
	close(up.release)
	out := <-answered
	var m dns.Msg
	if err := m.Unpack(out); err != nil {
		t.Fatalf("answer: %v", err)
	}
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			t.Errorf("the guest got %s for a name its policy no longer allows", a.A)
		}
	}
	if got := s.learnedMembers(t); strings.Contains(got, testvm.InternetAddr) {
		t.Errorf("an answer in flight during the change was learned after it:\n%s", got)
	}
}

// TestEgressForgetEvenIfSaveFailsOnBed is finding 2 (second half): when
// the state file could not be written, Set returned before forgetting the
// old policy's addresses, so they stayed open under the new policy. Now
// Set reports the error and has forgotten them. On the old code the
// address is still learned after the failed Set.
func TestEgressForgetEvenIfSaveFailsOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStack(t, ctx, Policy{Mode: "open"})
	dir := filepath.Join(t.TempDir(), "state")
	st, err := LoadState(filepath.Join(dir, "egress.json"))
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry(s.g, Rules{Mode: "open"}, st)
	allow, err := Compile(Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Set(ctx, "zonea", "sb-zonea", []string{s.bridge["zonea"]}, allow); err != nil {
		t.Fatal(err)
	}
	if _, err := s.g.Learn(ctx, s.bridge["zonea"], []netip.Addr{netip.MustParseAddr(testvm.InternetAddr)}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := s.learnedMembers(t); !strings.Contains(got, testvm.InternetAddr) {
		t.Fatalf("the resolved address was not learned:\n%s", got)
	}
	// the state directory becomes a file: the next save fails
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	none, _ := Compile(Policy{Mode: "none"})
	if err := reg.Set(ctx, "zonea", "sb-zonea", []string{s.bridge["zonea"]}, none); err == nil {
		t.Error("Set did not report the failed save")
	}
	if got := s.learnedMembers(t); strings.Contains(got, testvm.InternetAddr) {
		t.Errorf("the old policy's address is still learned after a Set whose save failed:\n%s", got)
	}
}
