package egress

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/bench"
	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// flowSysctls are what the daemon's guard sets in the node's namespace
// (conntrack accounting, for the flows' bytes) and short conntrack
// timeouts, so that a closed connection's entry expires within a second,
// not after TIME_WAIT's two minutes. The bed's node namespace goes with
// the bed.
var flowSysctls = map[string]string{
	"nf_conntrack_acct":                  "1",
	"nf_conntrack_tcp_timeout_time_wait": "1",
	"nf_conntrack_tcp_timeout_close":     "1",
}

const (
	// flowPoll is how often a block reads the record while it waits.
	flowPoll = 20 * time.Millisecond
	// flowQuiet is how long an on block waits for the follower's next
	// record before it gives up.
	flowQuiet = 10 * time.Second
)

// flowLegs sums the blocks of each leg.
type flowLegs struct {
	on, off       []time.Duration // connection latencies
	cpuOn, cpuOff time.Duration
	// follower is the CPU time of the follower's own thread
	follower time.Duration
	kept     int
	// drain is how long after its last connection the last on block's
	// follower recorded its last flow (the next off block waits as
	// long), longest the longest of them
	drain, longest time.Duration
}

// measureFlowCost measures the kernel flows' cost on the open zone, whose
// traffic never passes the daemon (the follower is its only record): n
// new HTTP connections from its guest with Flows running as the daemon
// runs it (conntrack events in the node's namespace, accounting on,
// recording into rec), and n with no follower, in blocks on, off, off,
// on, on, off... (two blocks a leg, four from 400 connections up), so
// that a drift of the machine's load weighs on both legs alike. It fails
// unless the follower recorded at least 99 % of the on leg's flows.
func (bd *bed) measureFlowCost(ctx context.Context, n int, rec *egress.Log, r *Result) error {
	if err := bd.b.Do(bd.b.NodeNS(), func() error {
		for k, v := range flowSysctls {
			if err := os.WriteFile(filepath.Join("/proc/sys/net/netfilter", k), []byte(v), 0o644); err != nil {
				return fmt.Errorf("flows: sysctl %s: %w", k, err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	dest := netip.AddrPortFrom(netip.MustParseAddr(testvm.InternetAddr), 80)
	w := &flowWatch{rec: rec, owner: "sb-open", ours: func(x egress.Record) bool {
		return x.Proto == "tcp" && x.Dest == dest && x.Guest.Addr == bd.openAddr
	}}
	w.read() // what the ring held before
	w.kept = 0
	var legs flowLegs
	for i, size := range flowBlockSizes(n) {
		for j := range 2 {
			if err := bd.flowBlock(ctx, size, (i+j)%2 == 0, w, &legs); err != nil {
				return err
			}
		}
	}
	if legs.kept < n-n/100 {
		return fmt.Errorf("flows: the follower recorded %d of %d connections", legs.kept, n)
	}
	if w.empty > 0 {
		return fmt.Errorf("flows: %d of %d records carry no packet counts (nf_conntrack_acct off?)", w.empty, w.kept)
	}
	r.Flows, r.FlowRecords, r.FlowDrain = n, legs.kept, legs.longest
	r.FlowOn, r.FlowOn99 = bench.Median(legs.on), bench.Quantile(legs.on, 0.99)
	r.FlowOff, r.FlowOff99 = bench.Median(legs.off), bench.Quantile(legs.off, 0.99)
	r.FlowCPUOn = legs.cpuOn * 1000 / time.Duration(n)
	r.FlowCPUOff = legs.cpuOff * 1000 / time.Duration(n)
	r.FlowFollower = legs.follower * 1000 / time.Duration(n)
	return nil
}

// flowBlockSizes splits n connections into the blocks of a leg: two,
// four from 400 up, never one empty; the remainder goes to the first.
func flowBlockSizes(n int) []int {
	blocks := 2
	if n >= 400 {
		blocks = 4
	}
	blocks = min(blocks, n)
	sizes := make([]int, blocks)
	for i := range sizes {
		sizes[i] = n / blocks
		if i < n%blocks {
			sizes[i]++
		}
	}
	return sizes
}

// flowBlock opens n connections from the open zone with the follower
// running (follow) or not, and adds their latencies and the process's
// CPU time to legs. The block starts with the zone's conntrack entries
// flushed while no follower listens, so that an on block's follower
// sees only its own block's flows, and ends by flushing them again: an
// expired entry ends (DESTROY) only when conntrack's garbage collector,
// shared by every namespace of the machine, next runs, up to a minute
// late; deleted, it ends at once, with the same event. An on block then
// waits until the follower recorded its n flows (or none came for
// flowQuiet), an off block as long as the last on block waited, reading
// the record as often. The process's CPU time covers the client, the
// internet host and the flushes (all in this process) in both, so the
// difference is the follower's, with the kernel's event delivery charged
// to this process. The follower's goroutine runs locked to a thread of
// its own, whose CPU time is its alone (the daemon does not lock it: a
// locked goroutine's wake-up is a hand-off between threads, which makes
// both figures somewhat higher than the daemon's).
func (bd *bed) flowBlock(ctx context.Context, n int, follow bool, w *flowWatch, legs *flowLegs) error {
	leg := "off"
	if follow {
		leg = "on"
	}
	if _, err := egress.FlushFrom(bd.node, []netip.Prefix{bd.openNet}); err != nil {
		return err
	}
	var flows *egress.Flows
	done := make(chan error, 1)
	tid := 0
	if follow {
		dnsPort, proxyPort := bd.cfg.Egress.Ports()
		flows = egress.NewFlows(egress.FlowConfig{DNSPort: dnsPort, ProxyPort: proxyPort, NetNS: bd.node}, bd.reg, w.rec,
			&egress.PortGuests{Ports: bd.guard.Ports}, &egress.PrefixAddrs{List: bd.links.Prefixes},
			slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
		fctx, stop := context.WithCancel(ctx)
		tids := make(chan int, 1)
		go func() {
			// never unlocked: the thread ends with the goroutine
			runtime.LockOSThread()
			tids <- unix.Gettid()
			done <- flows.Run(fctx)
		}()
		defer func() { stop(); <-done }()
		tid = <-tids
		select {
		case <-flows.Ready():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	kept := w.kept
	thread0, err := threadCPU(tid)
	if err != nil {
		return err
	}
	cpu0 := processCPU()
	ds, err := bd.connections(n)
	if err != nil {
		return fmt.Errorf("flows, follower %s: %w", leg, err)
	}
	last := time.Now()
	if _, err := egress.FlushFrom(bd.node, []netip.Prefix{bd.openNet}); err != nil {
		return err
	}
	if !follow {
		if err := w.idle(ctx, last.Add(legs.drain)); err != nil {
			return err
		}
		legs.cpuOff += processCPU() - cpu0
		legs.off = append(legs.off, ds...)
		return nil
	}
	var thread time.Duration
	cpuAt, at, err := w.await(ctx, kept+n, func() (err error) {
		thread, err = threadCPU(tid)
		return err
	})
	if err != nil {
		return err
	}
	if w.kept-kept < n-n/100 {
		return fmt.Errorf("flows: the follower recorded %d of a block's %d connections (%+v)", w.kept-kept, n, flows.Stats())
	}
	legs.cpuOn += cpuAt - cpu0
	legs.follower += thread - thread0
	legs.on = append(legs.on, ds...)
	legs.kept += w.kept - kept
	legs.drain = at.Sub(last)
	legs.longest = max(legs.longest, legs.drain)
	return nil
}

// connections times n new HTTP connections (connect, request, answer)
// from the open zone's guest to the internet host.
func (bd *bed) connections(n int) ([]time.Duration, error) {
	ds := make([]time.Duration, 0, n)
	for range n {
		d, err := bd.httpGet(bd.openNS)
		if err != nil {
			return nil, err
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// flowWatch reads the flow records of one owner as they come.
type flowWatch struct {
	rec   *egress.Log
	owner string
	ours  func(egress.Record) bool
	since uint64
	// kept counts the records ours selected, empty those of them without
	// packets
	kept, empty int
}

// read takes the records past the last read and reports whether there
// were any of ours.
func (w *flowWatch) read() bool {
	page := w.rec.Read(w.owner, egress.LogQuery{Type: egress.RecordFlow, Since: w.since})
	w.since = page.Next
	got := false
	for _, x := range page.Records {
		if w.ours(x) {
			w.kept++
			got = true
			if x.PacketsOut == 0 || x.PacketsIn == 0 {
				w.empty++
			}
		}
	}
	return got
}

// await reads the record until it holds n of ours, or none came for
// flowQuiet, and returns the process's CPU time and the time when the
// last came, calling also at then.
func (w *flowWatch) await(ctx context.Context, n int, also func() error) (time.Duration, time.Time, error) {
	if err := also(); err != nil {
		return 0, time.Time{}, err
	}
	cpu, at := processCPU(), time.Now()
	t := time.NewTicker(flowPoll)
	defer t.Stop()
	for w.kept < n && time.Since(at) < flowQuiet {
		select {
		case <-ctx.Done():
			return 0, time.Time{}, ctx.Err()
		case <-t.C:
		}
		if w.read() {
			if err := also(); err != nil {
				return 0, time.Time{}, err
			}
			cpu, at = processCPU(), time.Now()
		}
	}
	return cpu, at, nil
}

// idle reads the record as await does until deadline.
func (w *flowWatch) idle(ctx context.Context, deadline time.Time) error {
	t := time.NewTicker(flowPoll)
	defer t.Stop()
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		w.read()
	}
	return nil
}

// threadCPU is the CPU time of this process's thread tid so far (the
// first field of its schedstat, in nanoseconds); 0 for tid 0.
func threadCPU(tid int) (time.Duration, error) {
	if tid == 0 {
		return 0, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/schedstat", tid))
	if err != nil {
		return 0, fmt.Errorf("flows: the follower's CPU time: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("flows: the follower's CPU time: schedstat %q", b)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("flows: the follower's CPU time: %w", err)
	}
	return time.Duration(ns), nil
}
