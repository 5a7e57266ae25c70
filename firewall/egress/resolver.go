package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// ResolverConfig configures the resolver.
type ResolverConfig struct {
	// Upstreams are the resolvers allowed names are forwarded to
	// ("ip:port"), tried in order.
	Upstreams []string
	// TTLFloor and TTLCeiling clamp how long a learned address stays open
	// (and the TTL the guest sees). Zero means 30s and 1h.
	TTLFloor, TTLCeiling time.Duration
	// Mark is set on the upstream sockets (firewall.EgressConfig.ResolverMark):
	// the guard drops them while the lockdown is on.
	Mark uint32
	// Timeout bounds one upstream exchange. Zero means 3s.
	Timeout time.Duration
	// Dial opens upstream connections; nil means a net.Dialer setting
	// Mark. Tests pass one that dials inside the node's namespace.
	Dial DialFunc
	// QueriesPerOwner bounds the UDP queries one owner (sandbox) has in
	// flight; TCPPerOwner its DNS-over-TCP connections. A query or
	// connection past it is dropped and counted (reason quota). Zero
	// means 16 and 8.
	QueriesPerOwner, TCPPerOwner int
	// OpenQueriesPerOwner is QueriesPerOwner for an open sandbox, whose
	// questions (to its zone's dnsmasq, answerOpen) have their own share
	// and node total: what a zone's dnsmasq forwards at once (150 by
	// default) was an open guest's before its questions came here, and
	// slow names of an allow-list sandbox must not wait behind them
	// either. Zero means 4 * QueriesPerOwner.
	OpenQueriesPerOwner int
	// Owners is how many owners at their share the node totals hold:
	// QueriesPerOwner*Owners UDP queries in flight and TCPPerOwner*Owners
	// TCP connections. Zero means DefaultOwners.
	Owners int
	// ZoneNames, when set, names what each zone's own dnsmasq holds:
	// those names are answered by asking that dnsmasq (on the address
	// the query was redirected to), in every mode, never upstream.
	ZoneNames ZoneNames
	// Domain, when set, returns zone's DNS domain ("" for none; [egress]
	// zone_domain): a VM name of the sandbox is answered under it too
	// (vmnames.go).
	Domain func(zone string) string
	// Log, when set, records every question answered for a guest (its
	// owner's ring), the guest named by Guests (nil: by address alone).
	Log    *Log
	Guests Guests
}

// DialFunc opens a connection (net.Dialer.DialContext's shape).
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// markedDialer dials from sockets carrying mark.
func markedDialer(mark uint32, timeout time.Duration) DialFunc {
	d := &net.Dialer{Timeout: timeout, Control: MarkControl(mark)}
	return d.DialContext
}

func (c ResolverConfig) clamp(ttl time.Duration) time.Duration {
	lo, hi := c.TTLFloor, c.TTLCeiling
	if lo <= 0 {
		lo = 30 * time.Second
	}
	if hi <= 0 {
		hi = time.Hour
	}
	return min(max(ttl, lo), max(hi, lo))
}

// Links names the interface a packet came in on (netlink in the
// daemon's namespace).
type Links interface {
	// ByIndex returns the name of interface index.
	ByIndex(index int) (string, error)
	// ByAddr returns the name of the interface holding address a (a
	// TCP connection's when the kernel's ingress index cannot name it:
	// ConnInterface).
	ByAddr(a netip.Addr) (string, error)
	// Holds reports whether interface index holds address a (a TCP
	// connection's ingress interface its local address: ConnInterface).
	Holds(index int, a netip.Addr) (bool, error)
}

// Resolver answers the DNS of allow-list and none zones (the guard
// redirects their udp/tcp 53 to it), and records the questions of the
// daemon's own open zones to their zone's resolver (answerOpen). The VM
// names of the asking guest's own sandbox (Registry.SetNames) are
// answered first, by the resolver itself, in every mode (vmnames.go).
// An allowed name is forwarded
// upstream and its A records are added to the zone's learned set before
// the guest gets the answer; every other name gets NXDOMAIN without any
// upstream query, so disallowed names carry no data out (no tunnelling).
//
// Design decisions:
//   - Only A queries go upstream; AAAA and every other type of an allowed
//     name get an empty NOERROR answer (guests have no IPv6, and TXT or
//     NULL records are the classic tunnel payload).
//   - The upstream query is built fresh from the question (new id, no
//     guest EDNS options), so nothing else from the guest reaches the
//     upstream.
//   - Answers pointing at private, metadata or uplink addresses, or at a
//     denied CIDR, are cut from the answer and never opened.
//   - The TTL the guest sees is never longer than the set timeout.
type Resolver struct {
	cfg     ResolverConfig
	reg     *Registry
	links   Links
	den     *Denials
	log     *slog.Logger
	up      Upstream
	queries *quota // UDP queries in flight, per owner and in all
	open    *quota // the same, of open sandboxes (answerOpen)
	conns   *quota // TCP connections, per owner and in all
}

// Upstream answers a query built by the resolver.
type Upstream interface {
	Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error)
}

// upstreams asks each configured resolver in turn, over UDP (TCP when
// truncated).
type upstreams struct {
	addrs   []string
	dial    DialFunc
	timeout time.Duration
}

// exchange sends m over one new connection and reads the reply with the
// same id. Over UDP the query is sent once more, from the same socket with
// the same id, halfway through the timeout, as a stub resolver retries: a
// forwarder such as the zone's dnsmasq resends upstream (to every server)
// only for a retry from the same source address, port and id, and since
// 2.83 attaches a query from a new source for a question in flight to the
// first (so never asks upstream again for it) (dnsmasq's src/forward.c,
// forward_query), so one datagram lost on its way upstream would
// otherwise cost the whole timeout.
func (u *upstreams) exchange(ctx context.Context, network, addr string, m *dns.Msg) (*dns.Msg, error) {
	c, err := u.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	start := time.Now()
	deadline := start.Add(u.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.SetWriteDeadline(deadline)
	co := &dns.Conn{Conn: c, UDPSize: 1232}
	if err := co.WriteMsg(m); err != nil {
		return nil, err
	}
	resend := time.Time{}
	if network == "udp4" || network == "udp" || network == "udp6" {
		resend = start.Add(deadline.Sub(start) / 2)
	}
	for {
		rd := deadline
		if !resend.IsZero() {
			rd = resend
		}
		_ = c.SetReadDeadline(rd)
		in, err := co.ReadMsg()
		if err != nil {
			var ne net.Error
			if !resend.IsZero() && errors.As(err, &ne) && ne.Timeout() && time.Now().Before(deadline) {
				resend = time.Time{}
				if err := co.WriteMsg(m); err != nil {
					return nil, err
				}
				continue
			}
			return nil, err
		}
		if in.Id == m.Id && in.Response && len(in.Question) == 1 && strings.EqualFold(in.Question[0].Name, m.Question[0].Name) {
			return in, nil
		}
	}
}

func (u *upstreams) Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	var errs []error
	for _, a := range u.addrs {
		in, err := u.exchange(ctx, "udp4", a, m)
		if err == nil && in.Truncated {
			in, err = u.exchange(ctx, "tcp4", a, m)
		}
		if err == nil {
			return in, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", a, err))
	}
	if len(errs) == 0 {
		return nil, errors.New("no upstream resolver configured")
	}
	return nil, errors.Join(errs...)
}

// NewResolver returns a resolver for the registry's rules. up == nil
// means cfg.Upstreams from sockets marked cfg.Mark.
func NewResolver(cfg ResolverConfig, reg *Registry, links Links, den *Denials, up Upstream, log *slog.Logger) *Resolver {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 3 * time.Second
	}
	if cfg.Dial == nil {
		cfg.Dial = markedDialer(cfg.Mark, cfg.Timeout)
	}
	if up == nil {
		up = &upstreams{addrs: cfg.Upstreams, dial: cfg.Dial, timeout: cfg.Timeout}
	}
	if cfg.QueriesPerOwner <= 0 {
		cfg.QueriesPerOwner = 16
	}
	if cfg.TCPPerOwner <= 0 {
		cfg.TCPPerOwner = 8
	}
	if cfg.OpenQueriesPerOwner <= 0 {
		cfg.OpenQueriesPerOwner = 4 * cfg.QueriesPerOwner
	}
	if cfg.Owners <= 0 {
		cfg.Owners = DefaultOwners
	}
	return &Resolver{cfg: cfg, reg: reg, links: links, den: den,
		log: log.With("component", "egress-resolver"), up: up,
		queries: newQuota(cfg.QueriesPerOwner, cfg.QueriesPerOwner*cfg.Owners),
		open:    newQuota(cfg.OpenQueriesPerOwner, cfg.OpenQueriesPerOwner*cfg.Owners),
		conns:   newQuota(cfg.TCPPerOwner, cfg.TCPPerOwner*cfg.Owners)}
}

// admit takes one unit of q (resource) for the owner of iface's policy:
// the owner's share first, then the node total; false (and the refusal
// counted for the owner) when either is full or iface is no guest's.
// release gives the unit back.
func (r *Resolver) admit(q *quota, resource, iface string) (release func(), ok bool) {
	_, owner, err := r.reg.For(iface)
	if err != nil {
		return nil, false
	}
	return admitOwner(q, r.den, resource, owner, Denial{})
}

// admitOwner takes one unit of q for owner, counting a refusal (with den
// recorded as a quota denial).
func admitOwner(q *quota, den *Denials, resource, owner string, d Denial) (release func(), ok bool) {
	if limit, ok := q.take(owner); !ok {
		den.Refuse(owner, resource, limit, d)
		return nil, false
	}
	return func() { q.give(owner) }, true
}

// MarkControl is a net.Dialer Control that sets SO_MARK on the socket
// before it connects (no-op for mark 0).
func MarkControl(mark uint32) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		if mark == 0 {
			return nil
		}
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
		})
		return errors.Join(err, serr)
	}
}

// udpReadBuffer is the receive buffer the resolver asks for its UDP
// socket (4 MiB; the kernel caps it at net.core.rmem_max).
const udpReadBuffer = 4 << 20

// ListenUDP opens the resolver's UDP socket on address (udp4, in the
// caller's network namespace), the only socket ServeUDP serves.
//
// The read loop names each query's interface by its IP_PKTINFO, and the
// kernel fills that in when it queues a datagram, only if the option is
// on by then: a datagram queued before it is read with interface 0, no
// guest's, and dropped. The guard's redirect is in force before the
// resolver reads (the table a restarting daemon adopts, a zone set right
// after the start), so the option is set before the socket is bound,
// and no query ever waits on it without its interface. The receive
// buffer is asked for with it: every zone's queries queue on this one
// socket, so there is room for a burst while the read loop catches up
// (the guard's DNS policer bounds each zone's rate before they get
// here); the kernel caps it at net.core.rmem_max and what it grants is
// used as is.
func ListenUDP(ctx context.Context, address string) (net.PacketConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = errors.Join(
				unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1),
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, udpReadBuffer))
		})
		return errors.Join(err, serr)
	}}
	pc, err := lc.ListenPacket(ctx, "udp4", address)
	if err != nil {
		return nil, fmt.Errorf("resolver: listen udp %s: %w", address, err)
	}
	return pc, nil
}

// pktinfoOn reports whether pc's socket has IP_PKTINFO on.
func pktinfoOn(pc net.PacketConn) (bool, error) {
	sc, ok := pc.(syscall.Conn)
	if !ok {
		return false, fmt.Errorf("%T is no socket", pc)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false, err
	}
	var on int
	var serr error
	if err := raw.Control(func(fd uintptr) {
		on, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO)
	}); err != nil {
		return false, err
	}
	return on != 0, serr
}

// ServeUDP answers queries on pc (from ListenUDP, bound in the daemon's
// namespace) until ctx is done. It returns after every query goroutine
// ended. A socket without IP_PKTINFO from its bind is refused: the
// queries queued on it before the option was set would be dropped.
//
// The read loop names each query's interface and takes its owner's share
// of the queries in flight before anything else (before the node total,
// before a goroutine starts): a query past the owner's share is dropped
// at once and costs no other owner anything.
func (r *Resolver) ServeUDP(ctx context.Context, pc net.PacketConn) error {
	on, err := pktinfoOn(pc)
	if err != nil {
		return fmt.Errorf("resolver: pktinfo: %w", err)
	}
	if !on {
		return errors.New("resolver: the udp socket was bound without IP_PKTINFO (open it with ListenUDP)")
	}
	// the option is on already: this sizes the reads' control buffers
	p := ipv4.NewPacketConn(pc)
	if err := p.SetControlMessage(ipv4.FlagInterface|ipv4.FlagDst, true); err != nil {
		return fmt.Errorf("resolver: pktinfo: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = pc.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	names := newIndexNames(r.links, r.reg)
	for {
		buf := make([]byte, 1500)
		n, cm, src, err := p.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("resolver: read: %w", err)
		}
		if cm == nil {
			continue
		}
		iface, owner, open, err := names.byIndex(cm.IfIndex)
		if err != nil {
			continue
		}
		q := r.queries
		if open {
			q = r.open
		}
		release, ok := admitOwner(q, r.den, ResourceDNSUDP, owner, Denial{})
		if !ok {
			continue // past the owner's share or the node total: the guest retries
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer release()
			qctx, cancel := context.WithTimeout(ctx, 2*r.cfg.Timeout)
			defer cancel()
			local, _ := netip.AddrFromSlice(cm.Dst.To4())
			out := r.answer(qctx, iface, local, addrOf(src), buf[:n], 512)
			if out != nil {
				_, _ = p.WriteTo(out, &ipv4.ControlMessage{Src: cm.Dst}, src)
			}
		}()
	}
}

// ServeTCP answers DNS over TCP on ln until ctx is done. A connection is
// held only within its owner's share and the node total (admit); the
// handlers at once are bounded by twice the node total (one refused past
// a share ends within microseconds).
func (r *Resolver) ServeTCP(ctx context.Context, ln net.Listener) error {
	return serveBounded(ctx, ln, 2*r.conns.node, "resolver", func(c net.Conn) {
		defer c.Close()
		r.serveConn(ctx, c)
	})
}

func (r *Resolver) serveConn(ctx context.Context, c net.Conn) {
	la, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return
	}
	a, _ := netip.AddrFromSlice(la.IP)
	iface, err := ConnInterface(r.links, c)
	if err != nil {
		return
	}
	release, ok := r.admit(r.conns, ResourceDNSTCP, iface)
	if !ok {
		return
	}
	defer release()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	for range 16 {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		qctx, cancel := context.WithTimeout(ctx, 2*r.cfg.Timeout)
		out := r.answer(qctx, iface, a.Unmap(), addrOf(c.RemoteAddr()), q, dns.MaxMsgSize)
		cancel()
		if out == nil {
			return
		}
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(out))), out...)); err != nil {
			return
		}
	}
}

// Answer returns the wire answer to query q that arrived on guest
// interface iface, or nil to send nothing (not a query at all). size
// bounds the answer (512 for UDP without EDNS).
func (r *Resolver) Answer(ctx context.Context, iface string, q []byte, size int) []byte {
	return r.answer(ctx, iface, netip.Addr{}, netip.Addr{}, q, size)
}

// addrOf is the IPv4 address of a UDP or TCP address (invalid for any
// other).
func addrOf(a net.Addr) netip.Addr {
	var ip net.IP
	switch v := a.(type) {
	case *net.UDPAddr:
		ip = v.IP
	case *net.TCPAddr:
		ip = v.IP
	}
	out, _ := netip.AddrFromSlice(ip)
	return out.Unmap()
}

// answer is Answer for a query from guest address src redirected to
// local (the zone's own address, where its dnsmasq listens; invalid: no
// zone-local names). The question and its answer are recorded (Log).
func (r *Resolver) answer(ctx context.Context, iface string, local, src netip.Addr, q []byte, size int) []byte {
	var req dns.Msg
	if err := req.Unpack(q); err != nil || req.Response {
		return nil
	}
	resp := new(dns.Msg)
	resp.SetReply(&req)
	resp.RecursionAvailable = true
	resp.Answer, resp.Ns, resp.Extra = nil, nil, nil
	pack := func() []byte {
		// a query with EDNS gets it back (RFC 6891 7), its DO bit
		// echoed (RFC 3225 3); over UDP the answer fits what the guest
		// can take, at most 1232 bytes
		if e := req.IsEdns0(); e != nil {
			size = max(size, min(int(e.UDPSize()), 1232))
			resp.SetEdns0(1232, e.Do())
		}
		resp.Truncate(size)
		b, err := resp.Pack()
		if err != nil {
			return nil
		}
		return b
	}
	if req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 || req.Question[0].Qclass != dns.ClassINET {
		resp.Rcode = dns.RcodeRefused
		return pack()
	}
	qn := req.Question[0]
	rules, owner, gen, began, err := r.reg.forAnswer(iface)
	if err != nil {
		resp.Rcode = dns.RcodeRefused
		return pack()
	}
	rec := Record{Type: RecordDNS, Name: recordName(strings.ToLower(strings.TrimSuffix(qn.Name, "."))), QType: dns.TypeToString[qn.Qtype]}
	if rec.QType == "" {
		rec.QType = strconv.Itoa(int(qn.Qtype))
	}
	done := func(verdict, reason string) []byte {
		out := pack()
		rec.Verdict, rec.Reason, rec.Rcode = verdict, reason, dns.RcodeToString[resp.Rcode]
		rec.Answers = answerAddrs(resp.Answer)
		rec.Guest = guestOf(r.cfg.Guests, src)
		openRing(r.reg, r.cfg.Log, iface, gen, began, owner).Add(rec)
		return out
	}
	// the sandbox's own VM names, in every mode, before anything else
	if addrs, ok := r.sandboxName(iface, began, qn.Name); ok {
		resp.Authoritative = true
		resp.Answer = nameRecords(qn, addrs)
		return done(VerdictAnswered, ReasonZone)
	}
	if rules.Mode == firewall.EgressOpen {
		return r.answerOpen(ctx, &req, resp, iface, gen, local, done)
	}
	if r.zoneLocal(iface, local, qn.Name) {
		if qn.Qtype == dns.TypeA {
			ans, err := r.askZone(ctx, local, qn.Name)
			if err != nil {
				r.log.Warn("zone resolver query failed", "name", qn.Name, "err", err)
				resp.Rcode = dns.RcodeServerFailure
				return done(VerdictFailed, ReasonZone)
			}
			resp.Rcode, resp.Answer = ans.Rcode, zoneRecords(ans.Answer)
		}
		return done(VerdictAnswered, ReasonZone)
	}
	// a denial is recorded only while the policy it was decided under is
	// in force: never for the next instance of the zone
	record := func(d Denial) { r.reg.IfCurrent(iface, gen, func() { r.den.Record(owner, d) }) }
	if rules.Mode == firewall.EgressNone {
		record(Denial{Reason: ReasonMode, Name: qn.Name})
		resp.Rcode = dns.RcodeNameError
		return done(VerdictRefused, ReasonMode)
	}
	if !rules.Resolves(qn.Name) {
		record(Denial{Reason: ReasonName, Name: qn.Name})
		resp.Rcode = dns.RcodeNameError
		return done(VerdictRefused, ReasonName)
	}
	if qn.Qtype != dns.TypeA {
		return done(VerdictAnswered, "") // NOERROR, no data
	}
	up, err := r.forward(ctx, qn)
	if err != nil {
		r.log.Warn("upstream query failed", "name", qn.Name, "err", err)
		resp.Rcode = dns.RcodeServerFailure
		return done(VerdictFailed, ReasonUpstream)
	}
	resp.Rcode = up.Rcode
	open := firewall.Opening{Checked: rules.AllowsName(qn.Name), Ports: rules.PortsOf(qn.Name)}
	ans, err := r.learn(ctx, iface, gen, rules, open, up.Answer)
	verdict, reason := VerdictAnswered, ""
	var qe *QuotaError
	switch {
	case errors.Is(err, ErrStale):
		// the policy changed while upstream answered: what the old one
		// allowed is not opened; the guest asks again under the new one
		resp.Rcode = dns.RcodeServerFailure
		verdict, reason = VerdictFailed, ReasonStale
	case errors.As(err, &qe):
		r.reg.IfCurrent(iface, gen, func() { r.den.Refuse(owner, ResourceLearned, qe.Limit, Denial{Name: qn.Name}) })
		resp.Rcode = dns.RcodeServerFailure
		verdict, reason = VerdictRefused, ReasonQuota
	case err != nil:
		r.log.Error("open learned addresses", "iface", iface, "err", err)
		resp.Rcode = dns.RcodeServerFailure
		verdict, reason = VerdictFailed, ReasonLearn
	}
	resp.Answer = ans
	return done(verdict, reason)
}

// answerOpen answers the question of an open zone's guest (the guard
// redirects only its DNS to the zone's own address, where the zone's
// dnsmasq listens, and only for the daemon's own zones): asked of that
// dnsmasq at local as the guest asked it (every type, its flags), its
// answer passed back unchanged, nothing learned (open mode has no sets to
// fill, so no learned-address quota either). Only the record is added.
//
// An answer that comes back after the sandbox's policy changed (to
// allowlist or none) is not handed over: SERVFAIL, as the allow-list path
// answers a stale one, and the guest asks again under the new policy.
func (r *Resolver) answerOpen(ctx context.Context, req, resp *dns.Msg, iface string, gen uint64, local netip.Addr, done func(verdict, reason string) []byte) []byte {
	qn := req.Question[0]
	reason := ""
	if r.zoneLocal(iface, local, qn.Name) {
		reason = ReasonZone
	}
	if !local.IsValid() {
		resp.Rcode = dns.RcodeServerFailure
		return done(VerdictFailed, ReasonZone)
	}
	m := new(dns.Msg)
	m.SetQuestion(qn.Name, qn.Qtype)
	m.RecursionDesired, m.CheckingDisabled, m.AuthenticatedData = req.RecursionDesired, req.CheckingDisabled, req.AuthenticatedData
	do := false
	if e := req.IsEdns0(); e != nil {
		do = e.Do()
	}
	m.SetEdns0(1232, do)
	z := &upstreams{addrs: []string{netip.AddrPortFrom(local, 53).String()}, dial: r.cfg.Dial, timeout: r.cfg.Timeout}
	ans, err := z.Exchange(ctx, m)
	if err != nil {
		r.log.Warn("zone resolver query failed", "name", qn.Name, "err", err)
		resp.Rcode = dns.RcodeServerFailure
		return done(VerdictFailed, ReasonZone)
	}
	if !r.reg.IfCurrent(iface, gen, func() {}) {
		resp.Rcode = dns.RcodeServerFailure
		return done(VerdictFailed, ReasonStale)
	}
	resp.Rcode, resp.Authoritative, resp.AuthenticatedData = ans.Rcode, ans.Authoritative, ans.AuthenticatedData
	resp.RecursionAvailable = ans.RecursionAvailable
	resp.Answer, resp.Ns = ans.Answer, ans.Ns
	for _, rr := range ans.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			resp.Extra = append(resp.Extra, rr)
		}
	}
	return done(VerdictAnswered, reason)
}

// answerAddrs are the A addresses of an answer (at most
// maxRecordAnswers).
func answerAddrs(rrs []dns.RR) []netip.Addr {
	var out []netip.Addr
	for _, rr := range rrs {
		if a, ok := rr.(*dns.A); ok && len(out) < maxRecordAnswers {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				out = append(out, ip)
			}
		}
	}
	return out
}

// openRing returns owner's ring of log if iface is still the instance
// begun at generation began (a question answered across a policy change
// of the same sandbox is its own: it was asked), or, for an interface
// with no instance of its own (began zero: the node default; or a caller
// that holds to the policy, the proxy), if its policy is still
// generation gen; so that no ring is made for an
// instance already dropped. nil, which records nothing, otherwise or
// without a log.
func openRing(reg *Registry, log *Log, iface string, gen, began uint64, owner string) *Ring {
	if log == nil {
		return nil
	}
	var ring *Ring
	if began != 0 {
		reg.IfInstance(iface, began, func() { ring = log.Open(owner) })
	} else {
		reg.IfCurrent(iface, gen, func() { ring = log.Open(owner) })
	}
	return ring
}

// zoneLocal reports whether name is one the dnsmasq of iface's zone
// holds (ZoneNames), for a query that came to that zone's address.
func (r *Resolver) zoneLocal(iface string, local netip.Addr, name string) bool {
	if r.cfg.ZoneNames == nil || !local.IsValid() {
		return false
	}
	zone, ok := r.reg.ZoneOf(iface)
	return ok && r.cfg.ZoneNames.Holds(zone, strings.ToLower(strings.TrimSuffix(name, ".")))
}

// askZone asks the zone's dnsmasq at local for name (A), with a fresh
// query.
func (r *Resolver) askZone(ctx context.Context, local netip.Addr, name string) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(strings.ToLower(name)), dns.TypeA)
	z := &upstreams{addrs: []string{netip.AddrPortFrom(local, 53).String()}, dial: r.cfg.Dial, timeout: r.cfg.Timeout}
	return z.Exchange(ctx, m)
}

// zoneRecords keeps the A and CNAME records of a zone dnsmasq's answer.
func zoneRecords(ans []dns.RR) []dns.RR {
	var out []dns.RR
	for _, rr := range ans {
		switch rr.(type) {
		case *dns.A, *dns.CNAME:
			out = append(out, rr)
		}
	}
	return out
}

// forward asks upstream for qn (type A) with a fresh query.
func (r *Resolver) forward(ctx context.Context, qn dns.Question) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(strings.ToLower(qn.Name)), dns.TypeA)
	m.SetEdns0(1232, false)
	return r.up.Exchange(ctx, m)
}

// learn opens the answer's A records for iface (as open says, under
// policy generation gen) and returns the records the guest may see:
// CNAMEs, and A records the guard accepted, each TTL cut to the set
// timeout. On error the guest sees nothing.
func (r *Resolver) learn(ctx context.Context, iface string, gen uint64, rules Rules, open firewall.Opening, ans []dns.RR) ([]dns.RR, error) {
	var addrs []netip.Addr
	minTTL := uint32(0)
	for _, rr := range ans {
		if a, ok := rr.(*dns.A); ok {
			ip, ok := netip.AddrFromSlice(a.A.To4())
			if !ok || rules.Denies(ip) {
				continue
			}
			addrs = append(addrs, ip)
			if minTTL == 0 || a.Hdr.Ttl < minTTL {
				minTTL = a.Hdr.Ttl
			}
		}
	}
	ttl := r.cfg.clamp(time.Duration(minTTL) * time.Second)
	ok := map[netip.Addr]bool{}
	if len(addrs) > 0 {
		skipped, err := r.reg.Learn(ctx, iface, gen, addrs, open, ttl)
		if err != nil {
			return nil, err
		}
		for _, a := range addrs {
			ok[a] = true
		}
		for _, s := range skipped {
			delete(ok, s)
		}
	}
	var out []dns.RR
	maxTTL := uint32(ttl / time.Second)
	for _, rr := range ans {
		switch v := rr.(type) {
		case *dns.A:
			ip, _ := netip.AddrFromSlice(v.A.To4())
			if !ok[ip] {
				continue
			}
		case *dns.CNAME:
		default:
			continue
		}
		rr.Header().Ttl = min(rr.Header().Ttl, maxTTL)
		out = append(out, rr)
	}
	return out, nil
}
