package egress

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// openStack is a recording stack whose zonec is the daemon's own open
// sandbox sb-zonec; its context ends with the test.
func openStack(t *testing.T) (context.Context, *stack, *Log) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	elog := NewLog(LogConfig{PerOwner: 256})
	s := newRecordingStack(t, ctx, elog)
	s.set(t, ctx, "zonec", Policy{Mode: "open"})
	return ctx, s, elog
}

// guestConn is a socket of zone's guest to its gateway's port 53
// (network udp4 or tcp4), closed with the test.
func guestConn(t *testing.T, s *stack, zone, network string) net.Conn {
	t.Helper()
	var c net.Conn
	if err := s.b.Do(s.guests[zone].NS, func() (err error) {
		c, err = net.Dial(network, s.gw[zone]+":53")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestOpenDNSLocalNameDuringSlowLookupsOnBed (found by review): an open
// sandbox's DNS went to its zone's dnsmasq alone (up to its 150 forwards
// in flight); through the resolver each question holds a slot of its
// owner's share until the dnsmasq answers, and a question past it is
// dropped. With the allow-list share (16), 20 lookups waiting on a
// silent upstream cost the sandbox even its own host name, which the
// dnsmasq answers at once; open sandboxes have their own, larger share
// (OpenQueriesPerOwner, 64 by default).
func TestOpenDNSLocalNameDuringSlowLookupsOnBed(t *testing.T) {
	_, s, _ := openStack(t)
	// the dnsmasq's upstream goes silent (an address nobody holds)
	if err := os.WriteFile(s.b.ResolvConf(), []byte("nameserver 203.0.113.77\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	guest := s.guests["zonec"]
	gw := s.gw["zonec"] + ":53"
	c := guestConn(t, s, "zonec", "udp4")
	for i := range 20 {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("slow%d-%s.example.", i, randLabel(t)), dns.TypeA)
		b, _ := m.Pack()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	err := s.b.Do(guest.NS, func() error {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("vm%d.", guest.VMID), dns.TypeA)
		c := &dns.Client{Timeout: 2 * time.Second}
		r, _, err := c.Exchange(m, gw)
		if err == nil && len(r.Answer) == 0 {
			err = fmt.Errorf("no answer: %s", dns.RcodeToString[r.Rcode])
		}
		return err
	})
	if err != nil {
		t.Errorf("the guest's own host name while 20 lookups wait upstream: %v (the dnsmasq answers it at once)", err)
	}
}

// TestOpenToAllowlistKeepsNoDnsmasqPathOnBed: a policy change keeps the
// kernel's connections (Egress.Set removes none), and NAT is decided at a
// connection's first packet. Before the change an open guest's socket to
// its gateway's port 53 was a connection to the dnsmasq itself, so after
// a change to allowlist that socket still asked the dnsmasq every name
// (past the allowlist, into the dnsmasq's upstream) for as long as the
// guest kept it busy. With the open zone's gateway DNS redirected to the
// resolver, the same socket meets the new policy.
func TestOpenToAllowlistKeepsNoDnsmasqPathOnBed(t *testing.T) {
	ctx, s, _ := openStack(t)
	c := guestConn(t, s, "zonec", "udp4")
	ask := func(name string) (*dns.Msg, error) {
		co := &dns.Conn{Conn: c}
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if err := co.WriteMsg(m); err != nil {
			return nil, err
		}
		return co.ReadMsg()
	}
	if r, err := ask(testvm.InternetName); err != nil || len(r.Answer) != 1 {
		t.Fatalf("open: %v, %v", r, err)
	}
	s.set(t, ctx, "zonec", Policy{Mode: "allowlist", Allow: []string{"pypi.org"}})
	r, err := ask(testvm.InternetName)
	if err != nil {
		t.Fatal(err)
	}
	if r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
		t.Errorf("a name the allowlist does not hold, on the socket opened under open: %s %v, want NXDOMAIN", dns.RcodeToString[r.Rcode], r.Answer)
	}
}

// TestOpenDNSHostileGuestOnBed: what an open guest reaches through the
// new redirect: several questions on one TCP connection are answered and
// recorded; ANY and AXFR of its zone go to its own dnsmasq only; DNS to
// another zone's gateway, the node's management address and the AWS DNS
// stand-in is not redirected (the first two are dropped by guest_in, the
// third is a forwarded flow as before) and makes no record.
func TestOpenDNSHostileGuestOnBed(t *testing.T) {
	ctx, s, elog := openStack(t)
	s.set(t, ctx, "zonea", Policy{Mode: "open"})
	guest := s.guests["zonec"]
	gw := s.gw["zonec"] + ":53"
	records := func() int { return len(elog.Read("sb-zonec", LogQuery{Type: RecordDNS}).Records) }

	// three questions on one TCP connection
	c := guestConn(t, s, "zonec", "tcp4")
	if err := func() error {
		co := &dns.Conn{Conn: c}
		for i, name := range []string{testvm.InternetName, fmt.Sprintf("vm%d", guest.VMID), "nothing.test"} {
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(name), dns.TypeA)
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if err := co.WriteMsg(m); err != nil {
				return fmt.Errorf("question %d: %w", i, err)
			}
			r, err := co.ReadMsg()
			if err != nil {
				return fmt.Errorf("question %d: %w", i, err)
			}
			t.Logf("tcp question %d %s: %s %v", i, name, dns.RcodeToString[r.Rcode], r.Answer)
		}
		return nil
	}(); err != nil {
		t.Errorf("several questions on one TCP connection: %v", err)
	}
	if n := records(); n != 3 {
		t.Errorf("%d records after three TCP questions", n)
	}
	for _, tc := range []struct {
		qtype uint16
		tcp   bool
	}{{dns.TypeANY, false}, {dns.TypeAXFR, true}, {dns.TypeIXFR, false}} {
		r, err := s.exchange("zonec", gw, "zonec.test", tc.qtype, tc.tcp)
		if err != nil {
			t.Logf("%s: %v", dns.TypeToString[tc.qtype], err)
			continue
		}
		t.Logf("%s: %s, %d answers", dns.TypeToString[tc.qtype], dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	before := records()
	for _, server := range []string{s.gw["zonea"] + ":53", testvm.NodeMgmtAddr + ":53"} {
		if r, err := s.exchange("zonec", server, testvm.InternetName, dns.TypeA, false); err == nil {
			t.Errorf("DNS to %s from zonec answered: %v", server, r)
		}
	}
	if n := records(); n != before {
		t.Errorf("%d records after questions to other servers, want %d", n, before)
	}
	if n := len(elog.Read("sb-zonea", LogQuery{}).Records); n != 0 {
		t.Errorf("zonea's record has %d records of zonec's questions", n)
	}
}

// TestOpenDNSUnderLockdownOnBed: with the guard's lockdown on, an open
// guest's question to its gateway still reaches its dnsmasq through the
// resolver (the resolver's marked socket goes out on lo, not a management
// interface): its own host name is answered, an internet name is not
// (the dnsmasq's upstream is dropped), and the guard verifies.
func TestOpenDNSUnderLockdownOnBed(t *testing.T) {
	ctx, s, _ := openStack(t)
	if err := s.g.SetLockdown(ctx, true); err != nil {
		t.Fatal(err)
	}
	guest := s.guests["zonec"]
	gw := s.gw["zonec"] + ":53"
	r, err := s.exchange("zonec", gw, fmt.Sprintf("vm%d", guest.VMID), dns.TypeA, false)
	if err != nil || len(r.Answer) != 1 {
		t.Errorf("own host name under lockdown: %v, %v", r, err)
	}
	if r, err := s.exchange("zonec", gw, "x"+randLabel(t)+"."+testvm.InternetName, dns.TypeA, false); err == nil && len(r.Answer) > 0 {
		t.Errorf("an internet name answered under lockdown: %v", r)
	} else if err == nil {
		t.Logf("internet name under lockdown: %s", dns.RcodeToString[r.Rcode])
	}
	if err := s.g.Verify(ctx); err != nil {
		t.Error(err)
	}
}
