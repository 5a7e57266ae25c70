// Package egress measures the egress policies on the test bed, ours
// against open mode side by side in one run (DESIGN.md section 10):
//
//   - the time from a policy change (Registry.Set, what PUT
//     /v1/sandboxes/{id}/egress calls) to enforced, probed from a guest
//     right after it returns;
//   - the latency of a DNS answer through the zone's resolver (allow-list
//     check, upstream query, learned into the set) vs the same query from
//     an open zone straight to the upstream;
//   - the latency of a new connection through the Host/SNI check (redirect,
//     peek, splice) vs direct from an open zone: HTTP on 80 and a TLS
//     handshake on 443;
//   - the cost of the egress record (issue 39): the same DNS answer and
//     HTTP connection through the resolver and proxy, and the process's
//     CPU time per 1000 of them (the resolver and proxy run in this
//     process), on a second bed whose resolver and proxy keep the record,
//     against the first, which keeps none;
//   - the cost of the record's kernel flows (Flows, conntrack's NEW and
//     DESTROY events in the node's namespace) on the recording bed's open
//     zone, whose traffic never passes the daemon: new HTTP connections
//     from its guest with the follower running and without, in
//     alternating blocks, and the process's CPU time per 1000 of them
//     (flows.go).
//
// The bench command's egress section ([Section]) calls Run. It needs root.
package egress

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/bench"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// Options tunes a run.
type Options struct {
	// Rounds is how many samples each figure takes (median reported);
	// 0 means 40.
	Rounds int
	// Flows is how many connections each leg of the kernel flows' cost
	// opens (follower on, then off); 0 means 1000.
	Flows int
}

// Result holds the medians of one run.
type Result struct {
	Rounds              int
	SetToEnforced       time.Duration // Registry.Set returned (kernel holds it)
	ProbesDropped       int           // probes right after Set that were dropped
	DNSCheck, DNSOpen   time.Duration
	HTTPCheck, HTTPOpen time.Duration
	TLSCheck, TLSOpen   time.Duration
	PolicyChanges       int
	// CutSet is how long Registry.Set to none took with CutConns
	// keep-alive connections open through the proxy (it closes them);
	// CutAll until the last of them saw its close in the guest; CutClosed
	// counts those that did (medians and totals over CutRounds).
	CutSet, CutAll      time.Duration
	CutConns, CutRounds int
	CutClosed           int
	// Recording off (the first bed) and on (a second bed keeping the
	// record): medians of a DNS answer and an HTTP connection through the
	// checks, and CPU time per 1000 of each pair (a question and a
	// connection), with RecordRecords the records the second bed kept.
	DNSOff, DNSOn   time.Duration
	HTTPOff, HTTPOn time.Duration
	CPUOff, CPUOn   time.Duration
	RecordRecords   int
	// The kernel flows (flows.go): Flows new HTTP connections from the
	// open zone with the conntrack follower off and on, their medians and
	// p99s, the process's CPU time per 1000 flows of each leg and the
	// follower's own thread's (FlowFollower), the flows
	// the follower recorded (FlowRecords of Flows) and how long after
	// a block's last connection it recorded the block's last flow, at
	// most (FlowDrain; an off block waits as long as the on block before
	// it).
	Flows                 int
	FlowOff, FlowOn       time.Duration
	FlowOff99, FlowOn99   time.Duration
	FlowCPUOff, FlowCPUOn time.Duration
	FlowFollower          time.Duration
	FlowRecords           int
	FlowDrain             time.Duration
}

// Print writes the figures.
func (r Result) Print(w io.Writer) {
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(b) }
	fmt.Fprintf(w, "policy change -> enforced (Registry.Set returned, kernel updated), median of %d: %v; probe from the guest right after: %d/%d dropped\n",
		r.PolicyChanges, r.SetToEnforced, r.ProbesDropped, r.PolicyChanges)
	fmt.Fprintf(w, "policy change -> all cut, %d keep-alive connections open through the proxy: Registry.Set returned (kernel updated, connections closed), median of %d: %v; last connection saw its close in the guest: %v; closed %d/%d\n",
		r.CutConns, r.CutRounds, r.CutSet, r.CutAll, r.CutClosed, r.CutConns*r.CutRounds)
	fmt.Fprintf(w, "DNS answer, allowlist zone through the resolver, median of %d: %v\n", r.Rounds, r.DNSCheck)
	fmt.Fprintf(w, "DNS answer, open zone straight to the upstream, median of %d: %v\n", r.Rounds, r.DNSOpen)
	fmt.Fprintf(w, "ratio resolver/open: %.2fx (added %v)\n", ratio(r.DNSCheck, r.DNSOpen), r.DNSCheck-r.DNSOpen)
	fmt.Fprintf(w, "new HTTP connection + request, through the Host check, median of %d: %v\n", r.Rounds, r.HTTPCheck)
	fmt.Fprintf(w, "new HTTP connection + request, open zone direct, median of %d: %v\n", r.Rounds, r.HTTPOpen)
	fmt.Fprintf(w, "ratio check/open: %.2fx (added %v)\n", ratio(r.HTTPCheck, r.HTTPOpen), r.HTTPCheck-r.HTTPOpen)
	fmt.Fprintf(w, "new TLS connection (connect + handshake), through the SNI check, median of %d: %v\n", r.Rounds, r.TLSCheck)
	fmt.Fprintf(w, "new TLS connection (connect + handshake), open zone direct, median of %d: %v\n", r.Rounds, r.TLSOpen)
	fmt.Fprintf(w, "ratio check/open: %.2fx (added %v)\n", ratio(r.TLSCheck, r.TLSOpen), r.TLSCheck-r.TLSOpen)
	if r.CPUOn > 0 {
		fmt.Fprintf(w, "egress record off/on: DNS answer through the resolver, median of %d: %v / %v (%.2fx)\n", r.Rounds, r.DNSOff, r.DNSOn, ratio(r.DNSOn, r.DNSOff))
		fmt.Fprintf(w, "egress record off/on: new HTTP connection through the Host check, median of %d: %v / %v (%.2fx, added %v)\n", r.Rounds, r.HTTPOff, r.HTTPOn, ratio(r.HTTPOn, r.HTTPOff), r.HTTPOn-r.HTTPOff)
		fmt.Fprintf(w, "egress record off/on: process CPU per 1000 (DNS answer + HTTP connection), both sides in this process: %v / %v (%.2fx, recording adds %v; %d records kept)\n",
			r.CPUOff, r.CPUOn, ratio(r.CPUOn, r.CPUOff), r.CPUOn-r.CPUOff, r.RecordRecords)
	}
	if r.FlowCPUOn > 0 {
		fmt.Fprintf(w, "egress record off/on: kernel flows (conntrack follower), open zone, new HTTP connection (connect + request + response), median of %d: %v / %v (%.2fx, added %v); p99: %v / %v (%.2fx)\n",
			r.Flows, r.FlowOff, r.FlowOn, ratio(r.FlowOn, r.FlowOff), r.FlowOn-r.FlowOff, r.FlowOff99, r.FlowOn99, ratio(r.FlowOn99, r.FlowOff99))
		fmt.Fprintf(w, "egress record off/on: kernel flows, process CPU per 1000 flows (off: the client, the internet host and a conntrack flush a block, all in this process; on: the same plus the follower; each block until the follower's last record, at most %v after the block's last connection): %v / %v (%.2fx, the follower adds %v per 1000 flows, its own thread (locked to it for this count) %v; %d/%d flows recorded)\n",
			r.FlowDrain, r.FlowCPUOff, r.FlowCPUOn, ratio(r.FlowCPUOn, r.FlowCPUOff), r.FlowCPUOn-r.FlowCPUOff, r.FlowFollower, r.FlowRecords, r.Flows)
	}
}

// bed is the bed with the egress machinery in the node's namespace.
type bed struct {
	b       *testvm.Bed
	cfg     firewall.Config
	node    netns.NsHandle
	guard   *firewall.Guard
	links   *egress.NetlinkLinks
	reg     *egress.Registry
	allowNS string // guest namespace of the allowlist zone
	openNS  string // guest namespace of the open zone
	// the open zone's subnet and its guest's address
	openNet  netip.Prefix
	openAddr netip.Addr
}

// Run measures on a fresh bed, prints the figures to w and returns them.
func Run(ctx context.Context, o Options, w io.Writer) (Result, error) {
	if o.Rounds <= 0 {
		o.Rounds = 40
	}
	if o.Flows <= 0 {
		o.Flows = 1000
	}
	b, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		return Result{}, err
	}
	bd, stop, err := setup(ctx, b, nil)
	if err != nil {
		_ = b.Close()
		return Result{}, err
	}
	// The first bed goes before the second comes up (at the latest on
	// return): its processes must not load the second's figures.
	var once sync.Once
	down := func() { once.Do(func() { stop(); _ = b.Close() }) }
	defer down()
	r := Result{Rounds: o.Rounds}
	if err := bd.measurePolicyChanges(ctx, o.Rounds, &r); err != nil {
		return r, err
	}
	if err := bd.measurePolicyCut(ctx, o.Rounds, &r); err != nil {
		return r, err
	}
	if err := bd.measureLatency(ctx, o.Rounds, &r); err != nil {
		return r, err
	}
	if r.DNSOff, r.HTTPOff, r.CPUOff, err = bd.measureRecordCost(o.Rounds); err != nil {
		return r, err
	}
	down()
	// The second bed: the same, its resolver and proxy keeping the record.
	if err := bd.recordBed(ctx, o, &r); err != nil {
		return r, err
	}
	r.Print(w)
	return r, nil
}

// recordBed brings a second bed up whose resolver and proxy keep the
// egress record and measures the same pair on it, then the kernel
// flows' cost on its open zone.
func (bd *bed) recordBed(ctx context.Context, o Options, r *Result) error {
	b, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		return err
	}
	defer b.Close()
	// room for every flow of the flows' on leg
	rec := egress.NewLog(egress.LogConfig{PerOwner: max(egress.DefaultLogEntries, 2*o.Flows)})
	on, stop, err := setup(ctx, b, rec)
	if err != nil {
		return err
	}
	defer stop()
	allow, err := egress.Compile(egress.Policy{Mode: "allowlist", Allow: []string{"*." + testvm.InternetName, testvm.InternetName}})
	if err != nil {
		return err
	}
	if err := on.reg.Set(ctx, "zonea", "sb-allow", []string{"vneta"}, allow); err != nil {
		return err
	}
	if _, err := on.resolve(on.allowNS, testvm.InternetName); err != nil {
		return fmt.Errorf("positive control, allowed name: %w", err)
	}
	if r.DNSOn, r.HTTPOn, r.CPUOn, err = on.measureRecordCost(o.Rounds); err != nil {
		return err
	}
	page := rec.Read("sb-allow", egress.LogQuery{Limit: 1 << 20})
	r.RecordRecords = len(page.Records)
	if r.RecordRecords == 0 {
		return errors.New("the recording bed kept no record: its resolver and proxy did not record")
	}
	return on.measureFlowCost(ctx, o.Flows, rec, r)
}

// measureRecordCost times rounds DNS answers and HTTP connections from
// the allowlist zone (through the resolver and the proxy) and the
// process's CPU time per 1000 pairs.
func (bd *bed) measureRecordCost(rounds int) (dnsMed, httpMed, cpuPer1000 time.Duration, err error) {
	var dnsD, httpD []time.Duration
	cpu0 := processCPU()
	for range rounds {
		d, err := bd.resolve(bd.allowNS, "r"+randHex()+"."+testvm.InternetName)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("dns: %w", err)
		}
		dnsD = append(dnsD, d)
		if d, err = bd.httpGet(bd.allowNS); err != nil {
			return 0, 0, 0, fmt.Errorf("http: %w", err)
		}
		httpD = append(httpD, d)
	}
	cpu := processCPU() - cpu0
	return bench.Median(dnsD), bench.Median(httpD), cpu * 1000 / time.Duration(rounds), nil
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func setup(ctx context.Context, b *testvm.Bed, rec *egress.Log) (_ *bed, stop func(), err error) {
	var cleanups []func()
	// The error returns set stop to nil: the deferred clean-up calls its
	// own copy.
	undo := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	stop = undo
	defer func() {
		if err != nil {
			undo()
		}
	}()
	guests := map[string]*testvm.Guest{}
	subnets := map[string]netip.Prefix{}
	for i, id := range []string{"zonea", "zonec"} {
		n := byte(i + 1)
		vnet := "vnet" + id[len(id)-1:]
		v := testvm.VNet{Name: vnet, Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 10, n, 0}), 24),
			Gateway: netip.AddrFrom4([4]byte{10, 10, n, 1}),
			DHCP:    []testvm.DHCPRange{{Start: netip.AddrFrom4([4]byte{10, 10, n, 100}), End: netip.AddrFrom4([4]byte{10, 10, n, 200})}}, SNAT: true}
		if err := b.AddZone(ctx, testvm.Zone{ID: id, VNets: []testvm.VNet{v}}); err != nil {
			return nil, nil, err
		}
		g, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 101 + i, VNet: vnet})
		if err != nil {
			return nil, nil, err
		}
		guests[id], subnets[id] = g, v.Subnet
	}
	node, err := netns.GetFromName(b.NodeNS())
	if err != nil {
		return nil, nil, err
	}
	cleanups = append(cleanups, func() { node.Close() })
	dir, err := os.MkdirTemp("", "pve-inspect-bench-egress-")
	if err != nil {
		return nil, nil, err
	}
	cleanups = append(cleanups, func() { _ = os.RemoveAll(dir) })
	ec := firewall.EgressConfig{Default: firewall.ZoneEgress{Mode: firewall.EgressOpen}}
	fcfg := firewall.Config{DnsmasqUser: "dnsmasq", ProcRoot: filepath.Join(dir, "proc"),
		StateDir: filepath.Join(dir, "guard"), Egress: ec}
	g, err := firewall.New(fcfg, firewall.WithNetNS(node))
	if err != nil {
		return nil, nil, err
	}
	cleanups = append(cleanups, func() { _ = g.Close() })
	if err := g.Start(ctx); err != nil {
		return nil, nil, err
	}
	if err := g.SetZones(ctx, map[string][]string{"zonea": {"vneta"}, "zonec": {"vnetc"}}); err != nil {
		return nil, nil, err
	}
	var ports []firewall.Port
	for _, gs := range guests {
		ports = append(ports, firewall.Port{Name: fmt.Sprintf("tap%di0", gs.VMID), MAC: gs.MAC, IPv4: []netip.Addr{gs.IPv4()}})
	}
	if err := g.SetPorts(ctx, ports); err != nil {
		return nil, nil, err
	}
	links, err := egress.NewNetlinkLinks(node)
	if err != nil {
		return nil, nil, err
	}
	cleanups = append(cleanups, links.Close)
	reg := egress.NewRegistry(g, egress.Rules{Mode: firewall.EgressOpen}, nil)
	den := egress.NewDenials()
	log := slog.New(slog.DiscardHandler)
	res := egress.NewResolver(egress.ResolverConfig{Upstreams: []string{testvm.InternetAddr + ":53"},
		Dial: dialIn(b, ec.ResolverMark()), Log: rec}, reg, links, den, nil, log)
	proxy := egress.NewProxy(egress.ProxyConfig{Dial: dialIn(b, ec.ProxyMark()), Log: rec}, reg, links, den, log)
	dnsPort, proxyPort := ec.Ports()
	var pc net.PacketConn
	var proxyLn net.Listener
	if err := b.Do(b.NodeNS(), func() (err error) {
		if pc, err = egress.ListenUDP(ctx, fmt.Sprintf(":%d", dnsPort)); err != nil {
			return err
		}
		proxyLn, err = net.Listen("tcp4", fmt.Sprintf(":%d", proxyPort))
		return err
	}); err != nil {
		return nil, nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = res.ServeUDP(sctx, pc); done <- struct{}{} }()
	go func() { _ = proxy.Serve(sctx, proxyLn); done <- struct{}{} }()
	cleanups = append(cleanups, func() { cancel(); <-done; <-done })
	open, _ := egress.Compile(egress.Policy{Mode: "open"})
	if err := reg.Set(ctx, "zonec", "sb-open", []string{"vnetc"}, open); err != nil {
		return nil, nil, err
	}
	return &bed{b: b, cfg: fcfg, node: node, guard: g, links: links, reg: reg, allowNS: guests["zonea"].NS, openNS: guests["zonec"].NS,
		openNet: subnets["zonec"], openAddr: guests["zonec"].IPv4()}, stop, nil
}

// dialIn dials from the node's namespace with the daemon's socket mark.
func dialIn(b *testvm.Bed, mark uint32) egress.DialFunc {
	return func(ctx context.Context, network, address string) (c net.Conn, err error) {
		err = b.Do(b.NodeNS(), func() error {
			d := net.Dialer{Control: egress.MarkControl(mark)}
			c, err = d.DialContext(ctx, network, address)
			return err
		})
		return c, err
	}
}

// measurePolicyChanges flips the allowlist zone between a policy that
// allows the internet host by CIDR and none, timing each Set, and probes
// from the guest right after each change to none.
func (bd *bed) measurePolicyChanges(ctx context.Context, rounds int, r *Result) error {
	allow, err := egress.Compile(egress.Policy{Mode: "allowlist", Allow: []string{testvm.InternetAddr + "/32"}})
	if err != nil {
		return err
	}
	none, _ := egress.Compile(egress.Policy{Mode: "none"})
	n := min(rounds, 20)
	var times []time.Duration
	for range n {
		if err := bd.reg.Set(ctx, "zonea", "sb-allow", []string{"vneta"}, allow); err != nil {
			return err
		}
		if err := bd.connect(bd.allowNS, testvm.InternetAddr+":80", time.Second); err != nil {
			return fmt.Errorf("positive control, CIDR-allowed host: %w", err)
		}
		start := time.Now()
		if err := bd.reg.Set(ctx, "zonea", "sb-allow", []string{"vneta"}, none); err != nil {
			return err
		}
		times = append(times, time.Since(start))
		var ne net.Error
		if err := bd.connect(bd.allowNS, testvm.InternetAddr+":80", 300*time.Millisecond); errors.As(err, &ne) && ne.Timeout() {
			r.ProbesDropped++
		}
	}
	r.SetToEnforced, r.PolicyChanges = bench.Median(times), n
	return nil
}

// measurePolicyCut opens keep-alive HTTP connections through the proxy
// from the allowlist zone, changes the policy to none and times the Set
// (which closes them) and the moment the last one saw its close in the
// guest.
func (bd *bed) measurePolicyCut(ctx context.Context, rounds int, r *Result) error {
	allow, err := egress.Compile(egress.Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	if err != nil {
		return err
	}
	none, _ := egress.Compile(egress.Policy{Mode: "none"})
	const conns = 8
	n := min(rounds, 10)
	var sets, alls []time.Duration
	for range n {
		if err := bd.reg.Set(ctx, "zonea", "sb-allow", []string{"vneta"}, allow); err != nil {
			return err
		}
		if _, err := bd.resolve(bd.allowNS, testvm.InternetName); err != nil {
			return fmt.Errorf("positive control, allowed name: %w", err)
		}
		var cs []net.Conn
		for range conns {
			c, err := bd.keepAlive(bd.allowNS)
			if err != nil {
				for _, c := range cs {
					c.Close()
				}
				return fmt.Errorf("positive control, keep-alive connection: %w", err)
			}
			cs = append(cs, c)
		}
		closed := make(chan time.Time, conns)
		for _, c := range cs {
			go func() {
				_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
				var b [1]byte
				_, err := c.Read(b[:])
				var ne net.Error
				if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
					closed <- time.Now()
					return
				}
				closed <- time.Time{}
			}()
		}
		start := time.Now()
		if err := bd.reg.Set(ctx, "zonea", "sb-allow", []string{"vneta"}, none); err != nil {
			return err
		}
		sets = append(sets, time.Since(start))
		var last time.Time
		for range conns {
			if at := <-closed; !at.IsZero() {
				r.CutClosed++
				if at.After(last) {
					last = at
				}
			}
		}
		if !last.IsZero() {
			alls = append(alls, last.Sub(start))
		}
		for _, c := range cs {
			c.Close()
		}
	}
	r.CutSet, r.CutConns, r.CutRounds = bench.Median(sets), conns, n
	if len(alls) > 0 {
		r.CutAll = bench.Median(alls)
	}
	return nil
}

// keepAlive opens a connection from ns to the internet host's port 80
// and gets one answer on it, leaving it open (HTTP/1.1 keep-alive).
func (bd *bed) keepAlive(ns string) (net.Conn, error) {
	var c net.Conn
	err := bd.b.Do(ns, func() (err error) {
		c, err = net.DialTimeout("tcp4", testvm.InternetAddr+":80", 3*time.Second)
		return err
	})
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+testvm.InternetName+"\r\n\r\n"); err != nil {
		c.Close()
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

func (bd *bed) connect(ns, addr string, timeout time.Duration) error {
	return bd.b.Do(ns, func() error {
		c, err := net.DialTimeout("tcp4", addr, timeout)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// measureLatency times DNS answers and new connections, allowlist zone
// (through the checks) and open zone (direct), interleaved.
func (bd *bed) measureLatency(ctx context.Context, rounds int, r *Result) error {
	allow, err := egress.Compile(egress.Policy{Mode: "allowlist", Allow: []string{"*." + testvm.InternetName, testvm.InternetName}})
	if err != nil {
		return err
	}
	if err := bd.reg.Set(ctx, "zonea", "sb-allow", []string{"vneta"}, allow); err != nil {
		return err
	}
	// learn the internet host's address for the allowlist zone
	if _, err := bd.resolve(bd.allowNS, testvm.InternetName); err != nil {
		return fmt.Errorf("positive control, allowed name: %w", err)
	}
	var dnsC, dnsO, httpC, httpO, tlsC, tlsO []time.Duration
	for range rounds {
		name := "b" + randHex() + "." + testvm.InternetName
		for _, m := range []struct {
			ns  string
			out *[]time.Duration
		}{{bd.allowNS, &dnsC}, {bd.openNS, &dnsO}} {
			d, err := bd.resolve(m.ns, name)
			if err != nil {
				return fmt.Errorf("dns %s: %w", name, err)
			}
			*m.out = append(*m.out, d)
		}
		for _, m := range []struct {
			ns   string
			h, t *[]time.Duration
		}{{bd.allowNS, &httpC, &tlsC}, {bd.openNS, &httpO, &tlsO}} {
			d, err := bd.httpGet(m.ns)
			if err != nil {
				return fmt.Errorf("http: %w", err)
			}
			*m.h = append(*m.h, d)
			d, err = bd.tlsHandshake(m.ns)
			if err != nil {
				return fmt.Errorf("tls: %w", err)
			}
			*m.t = append(*m.t, d)
		}
	}
	// the checked side really went through the resolver and the proxy
	st, err := firewall.Inspect(ctx, bd.cfg, firewall.WithNetNS(bd.node))
	if err != nil {
		return err
	}
	hits := map[string]uint64{}
	for _, c := range st.Counters {
		hits[c.Rule] += c.Packets
	}
	if hits["egress-peek"] < uint64(2*rounds) || hits["egress-dns-udp"] < uint64(rounds) {
		return fmt.Errorf("the allowlist zone bypassed the checks: peek %d, dns %d packets for %d rounds", hits["egress-peek"], hits["egress-dns-udp"], rounds)
	}
	r.DNSCheck, r.DNSOpen = bench.Median(dnsC), bench.Median(dnsO)
	r.HTTPCheck, r.HTTPOpen = bench.Median(httpC), bench.Median(httpO)
	r.TLSCheck, r.TLSOpen = bench.Median(tlsC), bench.Median(tlsO)
	return nil
}

// resolve asks the internet host's resolver (redirected to the zone's
// resolver in the allowlist zone) for name.
func (bd *bed) resolve(ns, name string) (time.Duration, error) {
	var d time.Duration
	err := bd.b.Do(ns, func() error {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		start := time.Now()
		resp, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(m, testvm.InternetAddr+":53")
		d = time.Since(start)
		if err == nil && (resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0) {
			err = fmt.Errorf("rcode %s, %d answers", dns.RcodeToString[resp.Rcode], len(resp.Answer))
		}
		return err
	})
	return d, err
}

func (bd *bed) httpGet(ns string) (time.Duration, error) {
	var d time.Duration
	err := bd.b.Do(ns, func() error {
		start := time.Now()
		c, err := net.DialTimeout("tcp4", testvm.InternetAddr+":80", 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+testvm.InternetName+"\r\nConnection: close\r\n\r\n"); err != nil {
			return err
		}
		b, err := io.ReadAll(c)
		d = time.Since(start)
		if err == nil && !slices.Equal(b[:min(12, len(b))], []byte("HTTP/1.1 200")) {
			err = fmt.Errorf("answer %q", b[:min(40, len(b))])
		}
		return err
	})
	return d, err
}

func (bd *bed) tlsHandshake(ns string) (time.Duration, error) {
	var d time.Duration
	err := bd.b.Do(ns, func() error {
		start := time.Now()
		c, err := net.DialTimeout("tcp4", testvm.InternetAddr+":443", 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		tc := tls.Client(c, &tls.Config{ServerName: testvm.InternetName, InsecureSkipVerify: true}) //nolint:gosec // the bed's self-signed host; timing only
		err = tc.Handshake()
		d = time.Since(start)
		return err
	})
	return d, err
}

func randHex() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
