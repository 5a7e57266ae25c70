// Package bench measures the host guard against the baseline an operator
// would otherwise run, side by side in one run on fresh network namespaces:
//
//   - applying the whole guard (one netlink batch, then read back and
//     verified) vs the same protections as iptables/ip6tables commands, one
//     process per rule, "-C || -I" as the reference provisioning scripts do;
//   - the time from a default-route change to the updated @mgmt set.
//
// The bench command's guard section ([Section]) calls Run. It needs root,
// iptables and ip6tables.
package guard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"time"

	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/bench"
	"github.com/pve-inspect/pve-inspect/firewall"
)

// Options tunes a run.
type Options struct {
	// Rounds is how many fresh namespaces each apply variant gets (median
	// reported); 0 means 5.
	Rounds int
	// RouteChanges is how many default-route moves are timed; 0 means 20.
	RouteChanges int
}

// Result holds medians of one run.
type Result struct {
	GuardApply     time.Duration // firewall Start: one batch + verify
	IptablesApply  time.Duration // one process per rule, -C || -I
	IptablesRules  int           // rules the baseline inserts
	IptablesProcs  int           // processes the baseline runs
	GuardRules     int
	RouteToSet     time.Duration // route replaced -> @mgmt updated in the kernel
	Rounds, Routes int
}

// Ratio is how many times faster the guard applies than the baseline.
func (r Result) Ratio() float64 { return float64(r.IptablesApply) / float64(r.GuardApply) }

// Print writes the figures.
func (r Result) Print(w io.Writer) {
	fmt.Fprintf(w, "guard apply (one netlink batch, %d rules, read back and verified), median of %d: %v\n", r.GuardRules, r.Rounds, r.GuardApply)
	fmt.Fprintf(w, "iptables/ip6tables baseline (%d rules, %d processes, -C || -I), median of %d: %v\n", r.IptablesRules, r.IptablesProcs, r.Rounds, r.IptablesApply)
	fmt.Fprintf(w, "ratio baseline/guard: %.1fx\n", r.Ratio())
	fmt.Fprintf(w, "default route change -> @mgmt updated, median of %d: %v\n", r.Routes, r.RouteToSet)
}

// Run measures everything and prints the figures to w.
func Run(ctx context.Context, o Options, w io.Writer) (*Result, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("bench: needs root (network namespaces, nftables)")
	}
	for _, bin := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("bench: baseline needs %s: %w", bin, err)
		}
	}
	if o.Rounds <= 0 {
		o.Rounds = 5
	}
	if o.RouteChanges <= 0 {
		o.RouteChanges = 20
	}
	r := &Result{Rounds: o.Rounds, Routes: o.RouteChanges}
	var guard, ipt []time.Duration
	// Every round's namespace stays until all rounds are done: deleting
	// one starts the kernel's clean-up of it (a workqueue), which would
	// run into the next round's timing.
	var nodes []*bench.Node
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	fresh := func() (*bench.Node, error) {
		n, err := bench.NewNode()
		if err == nil {
			nodes = append(nodes, n)
		}
		return n, err
	}
	for i := 0; i < o.Rounds; i++ {
		// alternate which side goes first so neither always runs on a
		// warmer machine
		for _, first := range []bool{i%2 == 0, i%2 != 0} {
			n, err := fresh()
			if err != nil {
				return nil, err
			}
			if first {
				d, rules, err := timeGuard(ctx, n)
				if err != nil {
					return nil, err
				}
				guard, r.GuardRules = append(guard, d), rules
			} else {
				d, rules, procs, err := timeIptables(ctx, n)
				if err != nil {
					return nil, err
				}
				ipt, r.IptablesRules, r.IptablesProcs = append(ipt, d), rules, procs
			}
		}
	}
	r.GuardApply, r.IptablesApply = bench.Median(guard), bench.Median(ipt)
	d, err := timeRouteChanges(ctx, o.RouteChanges)
	if err != nil {
		return nil, err
	}
	r.RouteToSet = d
	if w != nil {
		r.Print(w)
	}
	return r, nil
}

// timeGuard times the guard's Start on the fresh node n.
func timeGuard(ctx context.Context, n *bench.Node) (time.Duration, int, error) {
	dir, err := os.MkdirTemp("", "pve-inspect-bench")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	g, err := firewall.New(bench.GuardConfig(dir), firewall.WithNetNS(n.NS))
	if err != nil {
		return 0, 0, err
	}
	defer g.Close()
	start := time.Now()
	if err := g.Start(ctx); err != nil {
		return 0, 0, fmt.Errorf("bench: guard start: %w", err)
	}
	return time.Since(start), g.Desired().RuleCount(), nil
}

// baselineRules are the guard's protections as the reference scripts would
// write them: one iptables/ip6tables rule per (interface, address) case.
func baselineRules() [][]string {
	var rs [][]string
	v4 := func(a ...string) { rs = append(rs, append([]string{"iptables", "-w"}, a...)) }
	v6 := func(a ...string) { rs = append(rs, append([]string{"ip6tables", "-w"}, a...)) }
	for _, p := range firewall.DefaultMetadata4() {
		v4("-t", "raw", "PREROUTING", "-d", p.String(), "-j", "DROP")
	}
	for _, p := range firewall.DefaultMetadata6() {
		v6("-t", "raw", "PREROUTING", "-d", p.String(), "-j", "DROP")
	}
	v4("-t", "mangle", "FORWARD", "-s", "169.254.0.0/16", "-j", "DROP")
	v6("-t", "mangle", "FORWARD", "-j", "DROP")
	guests := []string{"vnetA", "vnetB"}
	nonUplink := append(slices.Clone(guests), "stor0")
	for _, a := range nonUplink {
		for _, b := range nonUplink {
			if a != b && (slices.Contains(guests, a) || slices.Contains(guests, b)) {
				v4("-t", "mangle", "FORWARD", "-i", a, "-o", b, "-j", "DROP")
			}
		}
	}
	for _, p := range firewall.DefaultPrivate4() {
		v4("-t", "mangle", "FORWARD", "-o", "eth0", "-d", p.String(), "-j", "DROP")
	}
	for _, g := range guests {
		for _, add := range []func(...string){v4, v6} {
			add("-t", "mangle", "INPUT", "-i", g, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
			add("-t", "mangle", "INPUT", "-i", g, "-p", "udp", "--dport", "67:68", "-j", "ACCEPT")
			add("-t", "mangle", "INPUT", "-i", g, "-p", "udp", "--dport", "53", "-j", "ACCEPT")
			add("-t", "mangle", "INPUT", "-i", g, "-p", "tcp", "--dport", "53", "-j", "ACCEPT")
			add("-t", "mangle", "INPUT", "-i", g, "-j", "DROP")
		}
	}
	return rs
}

// timeIptables applies baselineRules in the fresh namespace n the way the
// reference scripts do, "<cmd> -C <rule> || <cmd> -I <rule>", one process
// per command; the rules go in last to first so that inserting each at the
// top leaves them in order.
func timeIptables(ctx context.Context, n *bench.Node) (time.Duration, int, int, error) {
	rules := baselineRules()
	procs := 0
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return 0, 0, 0, err
	}
	defer orig.Close()
	if err := netns.Set(n.NS); err != nil {
		return 0, 0, 0, err
	}
	// children forked from this locked thread start in the namespace
	start := time.Now()
	for _, r := range slices.Backward(rules) {
		check := append(append([]string{}, r[:2]...), "-C")
		check = append(check, r[2:]...)
		if r[2] == "-t" {
			check = append(append([]string{}, r[:4]...), "-C")
			check = append(check, r[4:]...)
		}
		procs++
		if exec.CommandContext(ctx, check[0], check[1:]...).Run() == nil {
			continue
		}
		ins := append(append([]string{}, r[:4]...), "-I")
		ins = append(ins, r[4:]...)
		procs++
		if out, err := exec.CommandContext(ctx, ins[0], ins[1:]...).CombinedOutput(); err != nil {
			_ = netns.Set(orig)
			return 0, 0, 0, fmt.Errorf("bench: %v: %v: %s", ins, err, out)
		}
	}
	d := time.Since(start)
	if err := netns.Set(orig); err != nil {
		runtime.LockOSThread() // never give a thread in the wrong namespace back
		return 0, 0, 0, err
	}
	return d, len(rules), procs, nil
}

// timeRouteChanges runs a guard and moves the default route between eth0
// and eth1, timing each move until the guard has applied the new @mgmt.
func timeRouteChanges(ctx context.Context, changes int) (time.Duration, error) {
	n, err := bench.NewNode()
	if err != nil {
		return 0, err
	}
	defer n.Close()
	dir, err := os.MkdirTemp("", "pve-inspect-bench")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	g, err := firewall.New(bench.GuardConfig(dir), firewall.WithNetNS(n.NS))
	if err != nil {
		return 0, err
	}
	defer g.Close()
	if err := g.Start(ctx); err != nil {
		return 0, err
	}
	sub, unsub := g.Subscribe()
	defer unsub()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(rctx) }()
	defer func() { cancel(); <-done }()
	// let the watchers subscribe (their resync notifies nothing: no change)
	time.Sleep(200 * time.Millisecond)
	var ds []time.Duration
	for i := 0; i < changes; i++ {
		dev, gw := "eth1", "198.51.100.1"
		if i%2 == 1 {
			dev, gw = "eth0", "192.0.2.1"
		}
		start := time.Now()
		if err := n.DefaultVia(dev, gw); err != nil {
			return 0, err
		}
		for {
			select {
			case <-sub:
			case <-time.After(10 * time.Second):
				return 0, fmt.Errorf("bench: @mgmt never became %s", dev)
			}
			if m := g.Management(); len(m) == 1 && m[0] == dev {
				break
			}
		}
		ds = append(ds, time.Since(start))
		if err := g.Verify(ctx); err != nil {
			return 0, fmt.Errorf("bench: after route change: %w", err)
		}
	}
	return bench.Median(ds), nil
}
