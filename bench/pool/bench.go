// Package pool measures the warm pool on the test bed, in one run and
// side by side: create-to-ready of a claim against a cold create of the
// same shape (p50, p99, ratio) through the HTTP API, on the Proxmox
// emulator with real qemu-ga guests; the Proxmox calls each claimed create
// makes (the emulator counts them; an SDN apply is PUT /cluster/sdn); and
// Burst creates back to back against a pool of Target refilled in the
// background (hits, misses, p50). Needs root (the bed).
package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/bench"
	"github.com/pve-inspect/pve-inspect/internal/atomicfile"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// Options size a run; zero values take the defaults.
type Options struct {
	// Rounds is how many claims and how many cold creates are timed (20).
	Rounds int
	// Target is the pool's size (4); Burst how many creates go back to
	// back against it (20).
	Target, Burst int
}

// Result holds one run's figures.
type Result struct {
	ClaimP50, ClaimP99, ColdP50, ColdP99 time.Duration
	// Ratio is ColdP50 / ClaimP50.
	Ratio float64
	// CallsPerClaim counts the Proxmox requests of one claimed create, by
	// "METHOD route" (averaged over Rounds); SDNAppliesPerClaim is the
	// share of them that are PUT /cluster/sdn.
	CallsPerClaim                         map[string]float64
	SDNAppliesPerClaim, SDNAppliesPerCold float64
	// CallsPerClaimTotal and CallsPerCold are the totals per create.
	CallsPerClaimTotal, CallsPerCold float64
	// The parts of a claim, each timed alone on a claimed sandbox (p50):
	// an HTTP round trip of the API (GET /v1/healthz), the VM's tag and
	// name update (PUT /config on the emulator), a guest agent ping, one
	// atomic write (fsync) of a file the state file's size in its
	// directory (a claim writes the state file twice). The rest of a claim
	// is the engine's own work: match, lock, the state's JSON.
	StepHTTP, StepTag, StepPing, StepState time.Duration
	// BurstHits and the rest: Burst creates back to back.
	BurstHits, BurstMisses              int
	BurstP50, BurstHitP50, BurstMissP50 time.Duration
}

func (o *Options) defaults() {
	if o.Rounds <= 0 {
		o.Rounds = 20
	}
	if o.Target <= 0 {
		o.Target = 4
	}
	if o.Burst <= 0 {
		o.Burst = 20
	}
}

// Run brings a bed up, measures, prints a table to w and tears down.
func Run(ctx context.Context, o Options, w io.Writer) (*Result, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("poolbench: needs root (the test bed)")
	}
	o.defaults()
	node, err := bench.NewEmuNode(ctx)
	if err != nil {
		return nil, err
	}
	defer node.Close()
	shape := sandbox.PoolShape{Name: "small", Template: "debian", Target: o.Target}
	stateDir := filepath.Join(node.Bed.Dir(), "pool-state")
	eng, err := sandbox.New(sandbox.Options{
		Node: "pve", Proxmox: node.PX, Guests: node.QGA.SandboxGuests(), QGADir: node.Bed.QGADir(),
		StateDir: stateDir, Logger: slog.New(slog.DiscardHandler),
		WarmPool: []sandbox.PoolShape{shape}, PoolInterval: time.Hour,
	})
	if err != nil {
		return nil, err
	}
	c, closeAPI, err := bench.Serve(ctx, eng, sandboxapi.Options{})
	if err != nil {
		return nil, err
	}
	defer closeAPI()
	req := apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}}
	res := &Result{CallsPerClaim: map[string]float64{}}
	r := &runner{ctx: ctx, stateDir: stateDir, eng: eng, emu: node.Emu, c: c, req: req}

	// Cold creates first, the pool empty and not refilled: every create of
	// the shape misses and builds.
	coldRoutes := map[string]int{}
	cold, coldCalls, err := r.rounds(o.Rounds, false, coldRoutes)
	if err != nil {
		return nil, err
	}
	res.ColdP50, res.ColdP99 = bench.Quantile(cold, 0.5), bench.Quantile(cold, 0.99)
	res.CallsPerCold = float64(coldCalls) / float64(o.Rounds)
	res.SDNAppliesPerCold = float64(coldRoutes["PUT /cluster/sdn"]) / float64(o.Rounds)
	// Claims: the pool refilled (untimed) before each.
	byRoute := map[string]int{}
	claims, claimCalls, err := r.rounds(o.Rounds, true, byRoute)
	if err != nil {
		return nil, err
	}
	res.ClaimP50, res.ClaimP99 = bench.Quantile(claims, 0.5), bench.Quantile(claims, 0.99)
	if res.ClaimP50 > 0 {
		res.Ratio = float64(res.ColdP50) / float64(res.ClaimP50)
	}
	for k, v := range byRoute {
		res.CallsPerClaim[k] = float64(v) / float64(o.Rounds)
	}
	res.SDNAppliesPerClaim = res.CallsPerClaim["PUT /cluster/sdn"]
	res.CallsPerClaimTotal = float64(claimCalls) / float64(o.Rounds)
	if err := r.steps(o.Rounds, node, res); err != nil {
		return nil, err
	}
	if err := r.burst(o, res); err != nil {
		return nil, err
	}
	print(w, o, res)
	return res, nil
}

// runner holds what the phases share.
type runner struct {
	ctx      context.Context
	stateDir string
	eng      *sandbox.Engine
	emu      *pveemu.Server
	c        *client.Client
	req      apitype.CreateRequest
}

// rounds times n creates (each deleted, untimed); with claim the pool is
// refilled before each and every create must come from it, without it
// none may. It returns the times and the Proxmox requests the creates
// made, counted by "METHOD route" into byRoute when set.
func (r *runner) rounds(n int, claim bool, byRoute map[string]int) ([]time.Duration, int, error) {
	var ds []time.Duration
	calls := 0
	for range n {
		if claim {
			r.eng.MaintainPool(r.ctx)
		}
		before := len(r.emu.Requests())
		t0 := time.Now()
		sb, err := r.c.Create(r.ctx, r.req)
		if err != nil {
			return nil, 0, fmt.Errorf("create: %w", err)
		}
		ds = append(ds, time.Since(t0))
		recs := r.emu.Requests()[before:]
		calls += len(recs)
		for _, rec := range recs {
			if byRoute != nil {
				byRoute[rec.Method+" "+rec.Route]++
			}
		}
		if sb.FromPool != claim {
			return nil, 0, fmt.Errorf("create %s: from_pool %v, want %v", sb.ID, sb.FromPool, claim)
		}
		if err := r.c.Delete(r.ctx, sb.ID); err != nil {
			return nil, 0, fmt.Errorf("delete: %w", err)
		}
	}
	return ds, calls, nil
}

// steps times the parts of a claim on one claimed sandbox.
func (r *runner) steps(n int, node *bench.EmuNode, res *Result) error {
	r.eng.MaintainPool(r.ctx)
	sb, err := r.c.Create(r.ctx, r.req)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	vm := sb.VMs[0]
	tags := []string{"pvei-n-pve", "pvei-s-" + sb.ID}
	g := r.eng.Guest(vm.VMID)
	state := filepath.Join(r.stateDir, "sandboxes.json")
	doc, err := os.ReadFile(state)
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	var h, tg, p, sw []time.Duration
	for range n {
		t0 := time.Now()
		if _, err := r.c.Health(r.ctx); err != nil {
			return fmt.Errorf("healthz: %w", err)
		}
		t1 := time.Now()
		if err := node.PX.SetVMTags(r.ctx, vm.VMID, "pvei-"+sb.ID+"-"+vm.Name, tags); err != nil {
			return fmt.Errorf("tag: %w", err)
		}
		t2 := time.Now()
		if err := g.Ping(r.ctx); err != nil {
			return fmt.Errorf("ping: %w", err)
		}
		t3 := time.Now()
		if err := atomicfile.Write(state+".bench", doc, 0o600); err != nil {
			return fmt.Errorf("state write: %w", err)
		}
		h, tg, p, sw = append(h, t1.Sub(t0)), append(tg, t2.Sub(t1)), append(p, t3.Sub(t2)), append(sw, time.Since(t3))
	}
	res.StepHTTP, res.StepTag, res.StepPing, res.StepState = bench.Quantile(h, 0.5), bench.Quantile(tg, 0.5), bench.Quantile(p, 0.5), bench.Quantile(sw, 0.5)
	return r.c.Delete(r.ctx, sb.ID)
}

// burst fills the pool, starts the background refill and sends Burst
// creates back to back, then deletes them all.
func (r *runner) burst(o Options, res *Result) error {
	r.eng.MaintainPool(r.ctx)
	pctx, stop := context.WithCancel(r.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.eng.RunPool(pctx) }()
	var all, hits, misses []time.Duration
	var ids []string
	var err error
	for range o.Burst {
		t0 := time.Now()
		var sb apitype.Sandbox
		if sb, err = r.c.Create(r.ctx, r.req); err != nil {
			err = fmt.Errorf("burst create: %w", err)
			break
		}
		d := time.Since(t0)
		all = append(all, d)
		ids = append(ids, sb.ID)
		if sb.FromPool {
			hits = append(hits, d)
		} else {
			misses = append(misses, d)
		}
	}
	stop()
	wg.Wait()
	for _, id := range ids {
		if derr := r.c.Delete(r.ctx, id); derr != nil && err == nil {
			err = fmt.Errorf("burst delete: %w", derr)
		}
	}
	res.BurstHits, res.BurstMisses = len(hits), len(misses)
	res.BurstP50, res.BurstHitP50, res.BurstMissP50 = bench.Quantile(all, 0.5), bench.Quantile(hits, 0.5), bench.Quantile(misses, 0.5)
	return err
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func ms1(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func print(w io.Writer, o Options, r *Result) {
	fmt.Fprintf(w, "warm pool, one-VM sandboxes on the emulator and the bed, through the HTTP API (%d rounds each):\n", o.Rounds)
	fmt.Fprintf(w, "  create-to-ready, claim from the pool   p50 %s  p99 %s\n", ms(r.ClaimP50), ms(r.ClaimP99))
	fmt.Fprintf(w, "  create-to-ready, cold (same shape)     p50 %s  p99 %s\n", ms(r.ColdP50), ms(r.ColdP99))
	fmt.Fprintf(w, "  cold / claim (p50)                     %.1fx\n", r.Ratio)
	var routes []string
	total := 0.0
	for k, v := range r.CallsPerClaim {
		routes = append(routes, k)
		total += v
	}
	sort.Strings(routes)
	fmt.Fprintf(w, "  a claim's parts (p50, each timed alone): API round trip %s, tag+name PUT /config %s, agent ping %s, 2 x state file write with fsync %s; the rest (%s): match, lock, the state's JSON, scheduling\n",
		ms1(r.StepHTTP), ms1(r.StepTag), ms1(r.StepPing), ms1(2*r.StepState), ms1(r.ClaimP50-r.StepHTTP-r.StepTag-r.StepPing-2*r.StepState))
	fmt.Fprintf(w, "  Proxmox calls per claimed create       %.1f (cold: %.1f); SDN applies (PUT /cluster/sdn) per claim: %.1f (cold: %.1f)\n", total, r.CallsPerCold, r.SDNAppliesPerClaim, r.SDNAppliesPerCold)
	for _, k := range routes {
		fmt.Fprintf(w, "    %-60s %.1f\n", strings.TrimSpace(k), r.CallsPerClaim[k])
	}
	fmt.Fprintf(w, "  %d creates back to back, pool of %d refilled in the background: %d hits, %d misses; p50 %s (hits %s, misses %s)\n",
		o.Burst, o.Target, r.BurstHits, r.BurstMisses, ms(r.BurstP50), ms(r.BurstHitP50), ms(r.BurstMissP50))
}
