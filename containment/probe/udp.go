package probe

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// KindUDP sends a datagram (Payload) over a connected UDP socket to Addr
// and reports what came back, plus the canary of Addr's address (see
// [Result.Canary]).
const KindUDP Kind = "udp"

// OutcomeReply: a UDP datagram came back from the target's address and
// port (udp).
const OutcomeReply Outcome = "reply"

// UDP payloads: what a live service on the port must answer.
const (
	PayloadGeneric = ""    // a short text datagram (corosync/knet, SNMP and other ports)
	PayloadDNS     = "dns" // a DNS query for the root's NS records, without recursion
	PayloadNTP     = "ntp" // an NTP version 4 client request (mode 3)
)

// Canary ports lie above Linux's ephemeral range (32768-60999), so no
// client socket of the target sits on them; one is picked per address.
const (
	canaryPortMin = 61000
	canaryPortMax = 65535
	// The canary and the target's datagram are resent, at first after
	// these intervals, then after twice as long each time (at most
	// udpMaxInterval), until something comes back: a host's ICMP rate
	// limit (per peer, for IPv4 a burst of 6, then one a second; a fresh
	// IPv6 peer can get none for about a second) must not turn an answer
	// into silence, and resends to silent addresses must not spend a
	// router's ICMP budget that another canary needs.
	canaryInterval = 100 * time.Millisecond
	udpInterval    = 200 * time.Millisecond
	udpMaxInterval = 800 * time.Millisecond
	udpBuf         = 2048
)

// validateUDP checks a udp target's fields.
func validateUDP(t Target) error {
	if t.Method != "" || t.Path != "" || len(t.Headers) != 0 || t.QType != "" || t.Host != "" {
		return errors.New("udp target takes only id, kind, addr, name, resolver, payload, timeout_ms")
	}
	switch t.Payload {
	case PayloadGeneric, PayloadDNS, PayloadNTP:
		return nil
	}
	return fmt.Errorf("payload %q: want dns, ntp or none", clip(t.Payload, 16))
}

// validCanary reports whether c is a canary outcome a report may carry.
func validCanary(c Outcome) bool {
	switch c {
	case "", OutcomeReply, OutcomeRefused, OutcomeUnreachable, OutcomeNoReply, OutcomeError:
		return true
	}
	return false
}

// udpPayload builds the datagram of a payload kind.
func udpPayload(kind string) ([]byte, error) {
	switch kind {
	case PayloadDNS:
		var id [2]byte
		if _, err := rand.Read(id[:]); err != nil {
			return nil, err
		}
		msg := dnsmessage.Message{Header: dnsmessage.Header{ID: binary.BigEndian.Uint16(id[:])},
			Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName("."), Type: dnsmessage.TypeNS, Class: dnsmessage.ClassINET}}}
		return msg.Pack()
	case PayloadNTP:
		b := make([]byte, 48)
		b[0] = 0x23 // LI 0, version 4, mode 3 (client)
		// a random transmit timestamp, as clients send to match the reply
		if _, err := rand.Read(b[40:]); err != nil {
			return nil, err
		}
		return b, nil
	}
	return []byte("pve-inspect containment probe\n"), nil
}

// canaryKey is the context key of a run's canaries.
type canaryKey struct{}

// canaries are one run's canary results, one per address.
type canaries struct {
	mu     sync.Mutex // guards byAddr
	byAddr map[netip.Addr]*canary
}

// canary is one address's canary. sem (capacity 1) is held by the target
// that sends it; the others wait for it and read the result. (Only the
// canary's own port speaks for the address: a firewall may pass one port,
// say DNS, and drop the rest, so another row's answer proves nothing
// about them.)
type canary struct {
	sem    chan struct{}
	done   bool    // guarded by sem
	out    Outcome // guarded by sem
	detail string  // guarded by sem
}

// CanaryPhase is the longest time the canaries of req may take before its
// targets run (the host adds it to the time it allows the probe).
func CanaryPhase(req *Request) time.Duration {
	addrs := map[string]bool{}
	longest := time.Duration(0)
	for _, t := range req.Targets {
		if t.Kind != KindUDP {
			continue
		}
		if ap, err := netip.ParseAddrPort(t.Addr); err == nil {
			addrs[ap.Addr().String()] = true
		}
		d := time.Duration(t.TimeoutMS) * time.Millisecond
		if d <= 0 {
			d = DefaultTimeout * time.Millisecond
		}
		longest = max(longest, d)
	}
	batches := (len(addrs) + MaxConcurrency - 1) / MaxConcurrency
	return time.Duration(batches) * longest
}

// runCanaries sends the canary of every udp target's address, all at
// once and before any target runs (so the targets' own datagrams cannot
// spend a host's ICMP rate limit first), each for up to the longest udp
// timeout, and returns ctx carrying the results for the run.
func (p *Prober) runCanaries(ctx context.Context, req *Request, zone string) context.Context {
	cs := &canaries{byAddr: map[netip.Addr]*canary{}}
	ctx = context.WithValue(ctx, canaryKey{}, cs)
	var addrs []netip.Addr
	budget := time.Duration(0)
	for _, t := range req.Targets {
		if t.Kind != KindUDP {
			continue
		}
		ap, err := netip.ParseAddrPort(withZone(t.Addr, zone))
		if err != nil {
			continue
		}
		if _, ok := cs.byAddr[ap.Addr()]; !ok {
			cs.byAddr[ap.Addr()] = &canary{sem: make(chan struct{}, 1)}
			addrs = append(addrs, ap.Addr())
		}
		d := time.Duration(t.TimeoutMS) * time.Millisecond
		if d <= 0 {
			d = DefaultTimeout * time.Millisecond
		}
		budget = max(budget, d)
	}
	sem := make(chan struct{}, MaxConcurrency)
	var wg sync.WaitGroup
	for _, a := range addrs {
		c := cs.byAddr[a]
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-sem }()
			p.canary(ctx, c, a, budget)
		}()
	}
	if !waitBounded(ctx, &wg, CutGrace) {
		p.progress("canaries cut at the bound")
	} else {
		p.progress("canaries done")
	}
	return ctx
}

// udp probes a udp target: the canary of its address (normally sent by
// runCanaries already; else now, within two thirds of the timeout), then
// the target's own port.
func (p *Prober) udp(ctx context.Context, t Target, addr string) Result {
	payload, err := udpPayload(t.Payload)
	if err != nil {
		return Result{Outcome: OutcomeError, Detail: "payload: " + err.Error()}
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return Result{Outcome: OutcomeError, Detail: "addr: " + err.Error()}
	}
	deadline, _ := ctx.Deadline()
	c := canaryOf(ctx, ap.Addr())
	cout, cdetail := p.canary(ctx, c, ap.Addr(), time.Until(deadline)*2/3)
	out, detail := p.exchange(ctx, addr, payload, udpInterval)
	return Result{Outcome: out, Detail: detail + "; canary " + cdetail, Canary: cout}
}

// canaryOf returns the canary record of a in ctx's run.
func canaryOf(ctx context.Context, a netip.Addr) *canary {
	cs, _ := ctx.Value(canaryKey{}).(*canaries)
	if cs == nil {
		return &canary{sem: make(chan struct{}, 1)}
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c := cs.byAddr[a]
	if c == nil {
		c = &canary{sem: make(chan struct{}, 1)}
		cs.byAddr[a] = c
	}
	return c
}

// canary returns the canary result of a (sending it if no target of the
// run has yet, within budget), "" when ctx ended while waiting for it.
func (p *Prober) canary(ctx context.Context, c *canary, a netip.Addr, budget time.Duration) (Outcome, string) {
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return "", "not known: " + ctx.Err().Error()
	}
	defer func() { <-c.sem }()
	if c.done {
		return c.out, c.detail
	}
	port, err := randomPort()
	if err != nil {
		return OutcomeError, "port: " + err.Error()
	}
	cctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	payload, _ := udpPayload(PayloadGeneric)
	out, detail := p.exchange(cctx, netip.AddrPortFrom(a, port).String(), payload, canaryInterval)
	if ctx.Err() != nil {
		return "", "not known: " + ctx.Err().Error()
	}
	c.out, c.detail, c.done = out, "port "+strconv.Itoa(int(port))+": "+detail, true
	return c.out, c.detail
}

// randomPort picks a canary port.
func randomPort() (uint16, error) {
	var b [2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, err
	}
	return canaryPortMin + binary.BigEndian.Uint16(b[:])%(canaryPortMax-canaryPortMin+1), nil
}

// exchange sends payload to addr, again after interval, then after twice
// as long each time (at most udpMaxInterval), until ctx ends, and reports
// the first thing that comes back: a datagram (reply), an ICMP error
// (refused, unreachable) or nothing (no_reply).
func (p *Prober) exchange(ctx context.Context, addr string, payload []byte, interval time.Duration) (Outcome, string) {
	c, err := p.dialer().DialContext(ctx, "udp", addr)
	if err != nil {
		return udpError(ctx, err)
	}
	defer c.Close()
	recvErr(c)
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultTimeout * time.Millisecond)
	}
	buf := make([]byte, udpBuf)
	for time.Now().Before(deadline) {
		if _, err := c.Write(payload); err != nil {
			return udpError(ctx, err)
		}
		next := time.Now().Add(interval)
		interval = min(2*interval, udpMaxInterval)
		if next.After(deadline) {
			next = deadline
		}
		_ = c.SetReadDeadline(next)
		n, err := c.Read(buf)
		if err == nil {
			return OutcomeReply, strconv.Itoa(n) + " bytes back"
		}
		if !isTimeout(err) {
			return udpError(ctx, err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	return OutcomeNoReply, "no reply"
}

// udpError maps a UDP socket error (an ICMP error the kernel reported on
// the connected socket, or a local one) to an outcome.
func udpError(ctx context.Context, err error) (Outcome, string) {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return OutcomeRefused, "ICMP port unreachable"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EACCES),
		errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EHOSTDOWN), errors.Is(err, syscall.ENETDOWN),
		errors.Is(err, syscall.ENONET), errors.Is(err, syscall.ENOPROTOOPT):
		return OutcomeUnreachable, "unreachable: " + err.Error()
	case isTimeout(err) || ctx.Err() != nil:
		return OutcomeNoReply, "no reply"
	}
	return classify(ctx, err), err.Error()
}

// recvErr asks the kernel to report every ICMP error on c, not only the
// "hard" ones (port unreachable, prohibited): host and net unreachable then
// read as unreachable instead of silence. Best effort: without it those
// read as silence, which the canary judges the same way.
func recvErr(c net.Conn) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	v6 := false
	if ua, ok := c.RemoteAddr().(*net.UDPAddr); ok {
		v6 = ua.IP.To4() == nil
	}
	_ = rc.Control(func(fd uintptr) {
		if v6 {
			_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IPV6, syscall.IPV6_RECVERR, 1)
		} else {
			_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_RECVERR, 1)
		}
	})
}
