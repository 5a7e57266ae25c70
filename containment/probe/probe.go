package probe

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
)

// Dialer creates the probe's sockets. *net.Dialer satisfies it.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Prober runs requests.
type Prober struct {
	// Dialer creates every socket; nil means a plain net.Dialer.
	Dialer Dialer
	// Root is prepended to /proc and /etc paths when reading Facts; "" = "/".
	Root string
	// SendFrames sends raw Ethernet frames on the interface with the
	// index (the layer-2 kinds); nil means an AF_PACKET socket.
	SendFrames func(ifindex int, frames [][]byte) error
	// Ready gets a line when a keep-alive target waits for its signal
	// (KindKeepAlive); nil discards it.
	Ready io.Writer
	// Progress gets a line at each phase's end, and when rows are cut
	// (the host shows a killed probe's last lines); nil discards them.
	Progress io.Writer

	readyMu sync.Mutex // serializes the lines on Ready
}

// Run probes every target of req, at most req.Concurrency at a time, and
// gathers the local facts. Results are in request order. req must have
// passed [ValidateRequest].
func (p *Prober) Run(ctx context.Context, req *Request) *Report {
	facts := ReadFacts(p.Root)
	zone := ""
	if facts.DefaultRoute4 != nil {
		zone = facts.DefaultRoute4.Iface
	}
	ctx = p.runCanaries(ctx, req, zone)
	n := req.Concurrency
	if n <= 0 {
		n = DefaultConcurrency
	}
	results := make([]Result, len(req.Targets))
	// A row that does not end by ctx's end (one blocked in a call its
	// context does not reach) is cut: Run reports without it, and its
	// goroutine's late result is dropped (closed), so the host always
	// gets a report before its own timeout.
	var mu sync.Mutex
	filled := make([]bool, len(results))
	closed := false
	set := func(i int, r Result) {
		mu.Lock()
		defer mu.Unlock()
		if !closed {
			results[i], filled[i] = r, true
		}
	}
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i := range req.Targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				set(i, Result{ID: req.Targets[i].ID, Outcome: OutcomeError, Detail: "not run: " + ctx.Err().Error()})
				return
			}
			defer func() { <-sem }()
			set(i, p.one(ctx, req.Targets[i], zone))
		}()
	}
	cut := !waitBounded(ctx, &wg, CutGrace)
	mu.Lock()
	closed = true
	out := make([]Result, len(results))
	for i := range results {
		out[i] = results[i]
		if !filled[i] {
			out[i] = Result{ID: req.Targets[i].ID, Outcome: OutcomeError, Detail: CutDetail}
		}
	}
	mu.Unlock()
	if cut {
		p.progress("rows cut at the bound")
	}
	return &Report{Version: Version, Facts: facts, Results: out}
}

// CutDetail is the detail of a row Run cut at its bound.
const CutDetail = "cut: the row did not end by the probe's bound"

// CutGrace is how long Run and the canary phase wait past their context's
// end for what still runs before they go on without it.
const CutGrace = 2 * time.Second

// waitBounded waits for wg, or for ctx's end and grace more; it reports
// whether wg was done.
func waitBounded(ctx context.Context, wg *sync.WaitGroup, grace time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
	}
	select {
	case <-done:
		return true
	case <-time.After(grace):
		return false
	}
}

// progress writes a line to Progress, when set.
func (p *Prober) progress(msg string) {
	if p.Progress != nil {
		p.readyMu.Lock()
		defer p.readyMu.Unlock()
		_, _ = io.WriteString(p.Progress, "pve-inspect-probe: "+msg+"\n")
	}
}

// RunBound is the longest [Prober.Run] of req takes, facts aside: the
// canary phase ([CanaryPhase]), then the targets, at most req.Concurrency
// (c) at a time, each within its own timeout (longest: L). A slot takes a
// waiting target as soon as its own ends, so every c targets running at
// time kL are done by (k+1)L and c more have started: by kL at least
// (k+1)c have started, and the last ends by ceil(targets/c)·L. Blocked
// rows (silence) take the whole of their timeout, so a plan of blocked
// rows comes near the bound. A keep-alive target (K: both requests and
// its wait) adds K: by Graham's bound for greedy scheduling, a run ends
// by (work)/c + (1-1/c)·K, within ceil(targets/c)·L + K for one such
// target, and each more adds at most its own K. The host adds slack for
// start-up and the exec.
func RunBound(req *Request) time.Duration {
	n := req.Concurrency
	if n <= 0 {
		n = DefaultConcurrency
	}
	var longest, keepAlive time.Duration
	for _, t := range req.Targets {
		if t.Kind == KindKeepAlive {
			keepAlive += targetBound(t)
			continue
		}
		longest = max(longest, targetBound(t))
	}
	rounds := (len(req.Targets) + n - 1) / n
	return time.Duration(rounds)*longest + keepAlive + CanaryPhase(req)
}

// targetBound is the longest target t takes: its timeout, or for a
// keep-alive target both its requests and the wait for its signal.
func targetBound(t Target) time.Duration {
	ms := t.TimeoutMS
	if ms <= 0 {
		ms = DefaultTimeout
	}
	if t.Kind == KindKeepAlive {
		return keepAliveBound(ms)
	}
	return time.Duration(ms) * time.Millisecond
}

func (p *Prober) dialer() Dialer {
	if p.Dialer != nil {
		return p.Dialer
	}
	return &net.Dialer{}
}

// one probes a single target within its timeout.
func (p *Prober) one(ctx context.Context, t Target, zone string) Result {
	timeout := time.Duration(t.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = DefaultTimeout * time.Millisecond
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, targetBound(t))
	defer cancel()
	addr := withZone(t.Addr, zone)
	start := time.Now()
	var r Result
	if (t.Kind == KindTCP || t.Kind == KindUDP || t.Kind == KindKeepAlive) && t.Name != "" {
		// the address of a name, asked of the target's resolver (the
		// rows a guest tries after resolving an allowed name)
		ip, err := p.resolveA(ctx, t.Resolver, t.Name)
		if err != nil {
			r := Result{ID: t.ID, Outcome: OutcomeNoReply, Detail: clip("resolve "+t.Name+": "+err.Error(), MaxDetailLen)}
			r.ElapsedMS = int(time.Since(start).Milliseconds())
			return r
		}
		_, port, _ := net.SplitHostPort(t.Addr)
		addr = net.JoinHostPort(ip.String(), port)
	}
	switch t.Kind {
	case KindTCP:
		r = p.tcp(ctx, addr)
	case KindHTTP, KindHTTPS:
		r = p.http(ctx, t, addr)
	case KindDNS:
		r = p.dns(ctx, t, addr)
	case KindUDP:
		r = p.udp(ctx, t, addr)
	case KindKeepAlive:
		r = p.keepAlive(ctx, t, addr, timeout)
	case KindL2Control, KindL2SpoofAddr, KindL2SpoofMAC, KindL2GratuitousARP:
		r = p.layer2(ctx, t, zone)
	case KindIDMap, KindProcSys, KindSysfs, KindMount, KindKeyring, KindModule, KindNesting:
		r = p.local(ctx, t)
	default:
		r = Result{Outcome: OutcomeError, Detail: "unknown kind"}
	}
	r.ID = t.ID
	r.ElapsedMS = int(time.Since(start).Milliseconds())
	if err := parent.Err(); err != nil {
		// Cut by the run's own bound (or the caller), not by the row's
		// timeout: silence then is no verdict on the path.
		r.Outcome, r.Detail = OutcomeError, "not finished: "+err.Error()+" after "+strconv.Itoa(r.ElapsedMS)+" ms (was "+string(r.Outcome)+")"
	}
	r.Detail = clip(r.Detail, MaxDetailLen)
	return r
}

// tcp tries a TCP handshake.
func (p *Prober) tcp(ctx context.Context, addr string) Result {
	c, err := p.dialer().DialContext(ctx, "tcp", addr)
	if err != nil {
		return Result{Outcome: classify(ctx, err), Detail: err.Error()}
	}
	c.Close()
	return Result{Outcome: OutcomeOpen}
}

// classify maps a connect error to an outcome.
func classify(ctx context.Context, err error) Outcome {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
		return OutcomeRefused
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM),
		errors.Is(err, syscall.EHOSTDOWN), errors.Is(err, syscall.ENETDOWN),
		errors.Is(err, syscall.EADDRNOTAVAIL), errors.Is(err, syscall.EINVAL):
		return OutcomeUnreachable
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), ctx.Err() != nil:
		return OutcomeTimeout
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return OutcomeTimeout
	}
	return OutcomeError
}

// withZone gives a zone-less IPv6 link-local address the interface zone.
func withZone(addr, zone string) string {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || zone == "" || !ap.Addr().Is6() || ap.Addr().Zone() != "" {
		return addr
	}
	a := ap.Addr()
	if !a.IsLinkLocalUnicast() && !a.IsLinkLocalMulticast() {
		return addr
	}
	return netip.AddrPortFrom(a.WithZone(zone), ap.Port()).String()
}

// clip bounds s to n bytes of valid UTF-8 without control characters.
func clip(s string, n int) string {
	out := make([]rune, 0, len(s))
	size := 0
	for _, r := range s {
		if badRune(r) {
			r = '?'
		}
		size += utf8.RuneLen(r)
		if size > n {
			break
		}
		out = append(out, r)
	}
	return string(out)
}

// badRune reports runes that never appear in report text: invalid UTF-8,
// C0 and C1 controls, line separators, and the bidirectional controls a
// hostile guest could use to make a rendered row read differently.
func badRune(r rune) bool {
	return r == utf8.RuneError || r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) ||
		r == 0x2028 || r == 0x2029 || r == 0x200e || r == 0x200f || r == 0x061c ||
		(r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0xfeff
}
