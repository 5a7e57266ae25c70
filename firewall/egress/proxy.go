package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// ProxyConfig configures the peek proxy.
type ProxyConfig struct {
	// Mark is set on upstream connections (firewall.EgressConfig.ProxyMark):
	// the guard lets them out only through the uplink, never to private,
	// metadata or uplink-subnet addresses, and never under the lockdown.
	Mark uint32
	// PeekTimeout bounds the wait for the first bytes. Zero means 10s.
	PeekTimeout time.Duration
	// DialTimeout bounds the upstream connect. Zero means 10s.
	DialTimeout time.Duration
	// ConnsPerOwner bounds one owner's (sandbox's) connections at once; a
	// connection past it is reset and counted (reason quota). Zero
	// means 64.
	ConnsPerOwner int
	// Owners is how many owners at their share the node total holds.
	// Zero means DefaultOwners.
	Owners int
	// MaxConns is the node total of connections at once, checked after
	// the owner's share. Zero means ConnsPerOwner*Owners.
	MaxConns int
	// IdleTimeout closes a spliced connection with no byte either way
	// for that long. Zero means 5 minutes.
	IdleTimeout time.Duration
	// Dial opens upstream connections; nil means a net.Dialer setting
	// Mark. Tests pass one that dials inside the node's namespace.
	Dial DialFunc
	// Log, when set, records every connection handled for a guest (its
	// owner's ring): a refusal at once, any other when it ends. Guests
	// names the guest (nil: by address alone).
	Log    *Log
	Guests Guests
}

// Proxy checks tcp 80/443 connections from allow-list zones to addresses
// learned from names (the guard redirects them to it): it reads the first
// bytes, takes the TLS server_name or the HTTP Host, and splices the
// connection to its original destination only if the zone's policy
// allows that name. There is no TLS interception: the guest's TLS session
// is with the real server.
//
// What stays possible (documented in README): a guest may present an
// allowed name to any address that an allowed name resolved to, and a
// CDN that serves many names on one address routes by the name inside
// the encrypted request, so "fronting" through an allowed CDN name
// reaches whatever that CDN serves.
//
// Every connection is tracked by the guest interface it came from; a
// change of that interface's policy closes it (Registry.OnChange), and a
// spliced connection idle for IdleTimeout is closed.
type Proxy struct {
	cfg   ProxyConfig
	reg   *Registry
	links Links
	den   *Denials
	log   *slog.Logger

	conns *quota // connections, per owner and in all

	mu   sync.Mutex // guards live, open and idle
	live map[string]map[*tracked]struct{}
	// open counts the connections being served from each interface,
	// until each is recorded (cut or not); idle holds a channel per
	// interface an EndOf waits on, closed when its count is zero.
	open map[string]int
	idle map[string]chan struct{}
}

// tracked is one guest connection and, once dialled, its upstream.
type tracked struct {
	guest, up net.Conn
}

// DefaultProxyConnsPerOwner is one owner's share of the proxy's
// connections when a config leaves it out.
const DefaultProxyConnsPerOwner = 64

// NewProxy returns a proxy for the registry's rules.
func NewProxy(cfg ProxyConfig, reg *Registry, links Links, den *Denials, log *slog.Logger) *Proxy {
	if cfg.PeekTimeout <= 0 {
		cfg.PeekTimeout = 10 * time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.Dial == nil {
		cfg.Dial = markedDialer(cfg.Mark, cfg.DialTimeout)
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	if cfg.ConnsPerOwner <= 0 {
		cfg.ConnsPerOwner = DefaultProxyConnsPerOwner
	}
	if cfg.Owners <= 0 {
		cfg.Owners = DefaultOwners
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = cfg.ConnsPerOwner * cfg.Owners
	}
	p := &Proxy{cfg: cfg, reg: reg, links: links, den: den, log: log.With("component", "egress-proxy"),
		conns: newQuota(cfg.ConnsPerOwner, cfg.MaxConns), live: map[string]map[*tracked]struct{}{},
		open: map[string]int{}, idle: map[string]chan struct{}{}}
	reg.OnChange(p.cut)
	return p
}

// cut closes every connection from ifaces (their policy changed): the
// guest sees a reset.
func (p *Proxy) cut(ifaces []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutLocked(ifaces)
}

func (p *Proxy) cutLocked(ifaces []string) {
	for _, n := range ifaces {
		for t := range p.live[n] {
			if tc, ok := t.guest.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = t.guest.Close()
			if t.up != nil {
				_ = t.up.Close()
			}
		}
		delete(p.live, n)
	}
}

// track records t under iface; untrack forgets it (call it once t is
// recorded: an EndOf waiting for iface's connections is told).
func (p *Proxy) track(iface string, t *tracked) (untrack func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live[iface] == nil {
		p.live[iface] = map[*tracked]struct{}{}
	}
	p.live[iface][t] = struct{}{}
	p.open[iface]++
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(p.live[iface], t)
		if p.open[iface]--; p.open[iface] <= 0 {
			delete(p.open, iface)
			if ch := p.idle[iface]; ch != nil {
				close(ch)
				delete(p.idle, iface)
			}
		}
	}
}

// EndOf closes the connections the proxy serves from ifaces (a
// sandbox's bridges, its guests gone) and waits, until ctx is done, for
// each to be recorded. It is for the delete that hands the sandbox's
// record over (Log.Take): a connection is recorded when it ends, and one
// still open then (its guest gone, it ends at IdleTimeout or when its
// destination closes) would be recorded after the ring was taken, and
// so nowhere, so that a guest could keep what it sent out of the record
// handed over by leaving its connection open.
func (p *Proxy) EndOf(ctx context.Context, ifaces []string) error {
	p.mu.Lock()
	var waits []chan struct{}
	var names []string
	for _, n := range ifaces {
		if p.open[n] == 0 {
			continue
		}
		ch := p.idle[n]
		if ch == nil {
			ch = make(chan struct{})
			p.idle[n] = ch
		}
		waits, names = append(waits, ch), append(names, n)
	}
	p.cutLocked(ifaces)
	p.mu.Unlock()
	for i, ch := range waits {
		select {
		case <-ch:
		case <-ctx.Done():
			p.mu.Lock()
			defer p.mu.Unlock()
			for j := i; j < len(waits); j++ {
				if p.idle[names[j]] == waits[j] {
					delete(p.idle, names[j])
				}
			}
			return fmt.Errorf("egress proxy: the connections from %v not all recorded: %w", names[i:], ctx.Err())
		}
	}
	return nil
}

// setUp records the upstream of t (under the lock cut takes, so a cut
// either sees it or ran before and closed the guest side).
func (p *Proxy) setUp(t *tracked, up net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t.up = up
}

// Live returns the number of connections the proxy holds from iface.
func (p *Proxy) Live(iface string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.live[iface])
}

// Serve accepts redirected connections on ln until ctx is done; it
// returns after every connection it started has ended. A connection is
// held only within its owner's share and the node total (handle); the
// handlers at once are bounded by twice the node total (one refused past
// a share ends within microseconds).
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	return serveBounded(ctx, ln, 2*p.cfg.MaxConns, "proxy", func(c net.Conn) { p.handle(ctx, c) })
}

// originalDst returns the destination the guest asked for before the
// redirect (SO_ORIGINAL_DST).
func originalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a TCP connection")
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var m *unix.IPv6Mreq
	var serr error
	if err := rc.Control(func(fd uintptr) {
		m, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
	}); err != nil {
		return netip.AddrPort{}, err
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", serr)
	}
	// struct sockaddr_in: family(2) port(2, network order) addr(4)
	port := binary.BigEndian.Uint16(m.Multiaddr[2:4])
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(m.Multiaddr[4:8])), port), nil
}

func (p *Proxy) handle(ctx context.Context, c net.Conn) {
	defer c.Close()
	dst, err := originalDst(c)
	if err != nil {
		return
	}
	iface, err := ConnInterface(p.links, c)
	if err != nil {
		return
	}
	p.serve(ctx, c, iface, dst)
}

// serve checks and splices guest connection c, which came in on iface
// for dst, and records it (Log) when it ends.
func (p *Proxy) serve(ctx context.Context, c net.Conn, iface string, dst netip.AddrPort) {
	start := time.Now()
	rules, owner, gen, err := p.reg.ForGen(iface)
	if err != nil || rules.Mode != firewall.EgressAllowlist {
		return
	}
	// tracked from here: a change of the policy from now on closes the
	// connection; one before the tracking is seen by the check below
	t := &tracked{guest: c}
	defer p.track(iface, t)()
	ring := openRing(p.reg, p.cfg.Log, iface, gen, 0, owner)
	if !p.reg.Current(iface, gen) {
		return
	}
	rec := Record{Type: RecordConn, Time: start.UTC(), Proto: "tcp", Dest: dst, Guest: guestOf(p.cfg.Guests, addrOf(c.RemoteAddr()))}
	defer func() {
		rec.Duration = time.Since(start)
		ring.Add(rec)
	}()
	reset := func() {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // reset: the guest sees a refusal at once
		}
	}
	// a denial is recorded only while the policy it was decided under is
	// in force: never for the next instance of the zone
	refuse := func(d Denial) {
		rec.Verdict, rec.Reason = VerdictRefused, d.Reason
		d.Dest = dst.String()
		p.reg.IfCurrent(iface, gen, func() { p.den.Record(owner, d) })
		reset()
	}
	release, ok := admitOwner(p.conns, p.den, ResourceProxy, owner, Denial{Dest: dst.String()})
	if !ok {
		rec.Verdict, rec.Reason = VerdictRefused, ReasonQuota
		reset()
		return
	}
	defer release()
	name, kind, head, err := p.peek(c)
	if err != nil {
		refuse(Denial{Reason: ReasonPeek})
		return
	}
	rec.Name, rec.Check = name, checkOf(kind)
	if !rules.AllowsName(name) {
		refuse(Denial{Reason: rec.Check, Name: name})
		return
	}
	if rules.Denies(dst.Addr()) {
		refuse(Denial{Reason: ReasonAddress, Name: name})
		return
	}
	rec.Verdict, rec.Reason = p.relay(ctx, c, t, iface, gen, dst, head, &rec)
}

// checkOf is the reason a refused name of a kind of first bytes gets
// (and how the record says the name was seen).
func checkOf(kind string) string {
	if kind == kindHTTP {
		return ReasonHost
	}
	return ReasonSNI
}

// relay dials dst, sends head and splices c to it until either ends; it
// counts the bytes each way into rec and returns the verdict.
func (p *Proxy) relay(ctx context.Context, c net.Conn, t *tracked, iface string, gen uint64, dst netip.AddrPort, head []byte, rec *Record) (verdict, reason string) {
	dctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	up, err := p.cfg.Dial(dctx, "tcp4", net.JoinHostPort(dst.Addr().String(), strconv.Itoa(int(dst.Port()))))
	cancel()
	if err != nil {
		p.log.Debug("upstream connect failed", "dest", dst, "name", rec.Name, "err", err)
		return VerdictFailed, ReasonConnect
	}
	defer up.Close()
	p.setUp(t, up)
	if !p.reg.Current(iface, gen) {
		return VerdictFailed, ReasonStale // changed during the peek or the dial
	}
	_ = c.SetDeadline(time.Time{})
	if _, err := up.Write(head); err != nil {
		return VerdictFailed, ReasonConnect
	}
	out, in := splice(ctx, c, up, p.cfg.IdleTimeout)
	rec.BytesOut, rec.BytesIn = int64(len(head))+out, in
	return VerdictAllowed, ""
}

// peek reads until the server name is known.
func (p *Proxy) peek(c net.Conn) (name, kind string, head []byte, err error) {
	_ = c.SetReadDeadline(time.Now().Add(p.cfg.PeekTimeout))
	buf := make([]byte, 0, 2048)
	for {
		if len(buf) == cap(buf) {
			if len(buf) >= MaxPeek {
				return "", "", nil, errors.New("peek: no name in the first bytes")
			}
			buf = append(buf, make([]byte, min(len(buf), MaxPeek-len(buf)))...)[:len(buf)]
		}
		n, rerr := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		name, kind, err = peekName(buf)
		if !errors.Is(err, errNeedMore) {
			return name, kind, buf, err
		}
		if rerr != nil {
			return "", "", nil, fmt.Errorf("peek: %w", rerr)
		}
	}
}

// spliceBuf is the buffer of each direction of a spliced connection:
// with the node total of connections it bounds the proxy's memory
// (README: two buffers per connection).
const spliceBuf = 16 << 10

// splice copies both ways until both directions ended (or ctx is done),
// or until no byte went either way for idle: then both are closed. It
// returns the bytes written from a to b and from b to a.
func splice(ctx context.Context, a, b net.Conn, idle time.Duration) (aToB, bToA int64) {
	stop := context.AfterFunc(ctx, func() { _ = a.Close(); _ = b.Close() })
	defer stop()
	var last atomic.Int64 // unix nanoseconds of the last byte either way
	last.Store(time.Now().UnixNano())
	var wg sync.WaitGroup
	wg.Add(2)
	half := func(dst, src net.Conn, moved *int64) {
		defer wg.Done()
		buf := make([]byte, spliceBuf)
		for {
			_ = src.SetReadDeadline(time.Now().Add(idle))
			n, err := src.Read(buf)
			if n > 0 {
				last.Store(time.Now().UnixNano())
				_ = dst.SetWriteDeadline(time.Now().Add(idle))
				w, werr := dst.Write(buf[:n])
				*moved += int64(w)
				if werr != nil {
					_ = a.Close()
					_ = b.Close()
					return
				}
			}
			if err == nil {
				continue
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if time.Since(time.Unix(0, last.Load())) < idle {
					continue // the other direction is busy
				}
				_ = a.Close() // idle both ways
				_ = b.Close()
				return
			}
			break
		}
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	go half(a, b, &bToA)
	go half(b, a, &aToB)
	wg.Wait()
	return aToB, bToA
}
