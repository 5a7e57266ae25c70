// Package neighbour measures what a hostile neighbour costs the tenant
// next to it (issue 34), on the playground's real daemon (internal/
// tenantbed: the bed, the Proxmox API emulator on the node's :8006,
// pve-inspectd with its guard, resolver, proxy and TLS API), in one run:
// tenant B's exec round trip (argv `true`), a DNS answer through the
// zone's resolver, an event's publish-to-delivery on B's stream (the
// created, ready and deleted events of a sandbox B creates and deletes)
// and the node's APIs (the Proxmox API on :8006 from the management
// network, on a new connection each time, and the daemon's TLS API), first
// with B alone, then while tenant A, holding an owner-bound token of its
// own, floods DNS, the proxy and the network from every VM of its sandbox
// and holds every exec, file write and event stream the daemon lets it.
// It prints p50 and p99 of each and the ratio attacked/alone (goal: p99
// under attack within 2x of alone, and the APIs under 20 ms p99).
//
// The bench command's neighbour section ([Section]) calls Run. It needs
// root and the binaries `make build` puts next to the bench command.
package neighbour

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/bench"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/testvm"
	"github.com/pve-inspect/pve-inspect/testvm/tenantbed"
)

// Options tunes a run.
type Options struct {
	// Bin holds pve-inspect-demo, pve-inspectd and pve-inspect-probe;
	// "" means the bench command's own directory.
	Bin string
	// Rounds is the samples of each figure per phase [500: its p99 is the
	// 5th slowest, not the one or two slowest a run of 100 leaves]; Events
	// the sandboxes B creates and deletes per phase for the event figure
	// [20: 60 events, so that its p99 is not simply the slowest].
	Rounds, Events int
	// AttackVMs is the VMs of A's sandbox, each flooding [2].
	AttackVMs int
	// Attack bounds A's attack (its Flood is set to outlast the run
	// when zero).
	Attack tenantbed.AttackOptions
}

// Figure is one measure, alone and attacked.
type Figure struct {
	Name string
	// Goal is the attacked p99 this figure should stay under (0: none
	// beyond the 2x ratio).
	Goal            time.Duration
	Alone, Attacked []time.Duration
	// Failed counts attacked probes that failed (refused, stalled past
	// the probe's bound or answered wrong): not in Attacked.
	Failed    int
	FirstFail string
}

// Result is a run's figures and what A got.
type Result struct {
	Figures []Figure
	Attack  tenantbed.AttackStats
	// Options and VMs are A's attack and its VMs.
	Options tenantbed.AttackOptions
	VMs     int
}

// Print writes the figures.
func (r Result) Print(w io.Writer) {
	fmt.Fprintf(w, "tenant A (owner-bound token) held %d execs, %d file writes, %d event streams; first refusals: exec %q, file %q, stream %q\n",
		r.Attack.ExecsHeld, r.Attack.FilesHeld, r.Attack.StreamsHeld, r.Attack.ExecRefusal, r.Attack.FileRefusal, r.Attack.StreamRefusal)
	ao := r.Options.WithDefaults()
	fmt.Fprintf(w, "tenant A floods from each of %d VMs: DNS %d/s to the zone resolver (half denied names), %d connections held through the proxy, SYN %d/s to closed ports of the node, the gateway and the internet host and to the proxy, UDP %d/s to closed ports\n",
		r.VMs, ao.DNSRate, ao.Proxy, ao.SYNRate, ao.UDPRate)
	for _, l := range strings.Split(r.Attack.Flood, "\n") {
		if l != "" && !strings.Contains(l, context.Canceled.Error()) {
			// a flood that ended before Stop: say how
			fmt.Fprintf(w, "tenant A's flood ended early: %s\n", l)
		}
	}
	fmt.Fprintf(w, "%-44s %21s %34s %8s\n", "tenant B", "alone p50 / p99 (n)", "A attacking p50 / p99 (n, failed)", "p99 x")
	for _, f := range r.Figures {
		a50, a99 := bench.Quantile(f.Alone, 0.5), bench.Quantile(f.Alone, 0.99)
		x50, x99 := bench.Quantile(f.Attacked, 0.5), bench.Quantile(f.Attacked, 0.99)
		ratio := "n/a"
		if a99 > 0 && len(f.Attacked) > 0 {
			ratio = fmt.Sprintf("%.2fx", float64(x99)/float64(a99))
		}
		fmt.Fprintf(w, "%-44s %9s / %9s (%d) %10s / %9s (%d, %d) %8s\n", f.Name, round(a50), round(a99), len(f.Alone),
			round(x50), round(x99), len(f.Attacked), f.Failed, ratio)
	}
	fmt.Fprintln(w, "goals: p99 under attack within 2x of alone; the APIs under 20 ms p99 under attack")
	for _, f := range r.Figures {
		x99, a99 := bench.Quantile(f.Attacked, 0.99), bench.Quantile(f.Alone, 0.99)
		verdict := "met"
		switch {
		case f.Failed > 0:
			verdict = fmt.Sprintf("MISSED: %d probes failed under attack (first: %s)", f.Failed, f.FirstFail)
		case len(f.Attacked) == 0:
			verdict = "MISSED: no samples"
		case x99 > 2*a99:
			verdict = fmt.Sprintf("MISSED: p99 %.2fx of alone", float64(x99)/float64(a99))
		case f.Goal > 0 && x99 > f.Goal:
			verdict = fmt.Sprintf("MISSED: p99 %s over %s", round(x99), f.Goal)
		}
		fmt.Fprintf(w, "  %-42s %s\n", f.Name, verdict)
	}
}

func round(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	default:
		return d.Round(10 * time.Microsecond).String()
	}
}

// Run measures on a fresh playground, prints the figures to w and returns
// them.
func Run(ctx context.Context, o Options, w io.Writer) (Result, error) {
	if o.Bin == "" {
		self, err := os.Executable()
		if err != nil {
			return Result{}, err
		}
		o.Bin = filepath.Dir(self)
	}
	if o.Rounds <= 0 {
		o.Rounds = 500
	}
	if o.Events <= 0 {
		o.Events = 20
	}
	if o.AttackVMs <= 0 {
		o.AttackVMs = 2
	}
	fmt.Fprintf(w, "command: %s; the playground from %s\n", strings.Join(os.Args, " "), o.Bin)
	n, err := tenantbed.Start(ctx, o.Bin)
	if err != nil {
		return Result{}, err
	}
	defer n.Close()
	tokA, err := n.Token(ctx, "bench-tenant-a", "tenant-a")
	if err != nil {
		return Result{}, err
	}
	tokB, err := n.Token(ctx, "bench-tenant-b", "tenant-b")
	if err != nil {
		return Result{}, err
	}
	a, b := n.Client(tokA), n.Client(tokB)
	allow := &apitype.EgressPolicy{Mode: "allowlist", Allow: []string{"*." + testvm.InternetName, testvm.InternetName}}
	shape := apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: tenantbed.Template}}, Egress: allow}
	sb, err := b.Create(ctx, shape)
	if err != nil {
		return Result{}, fmt.Errorf("tenant B's sandbox: %w", err)
	}
	defer deleteSandbox(b, sb.ID)
	p, err := tenantbed.NewProber(ctx, n, b, sb)
	if err != nil {
		return Result{}, err
	}
	defer p.Close()
	figs := []Figure{
		{Name: "exec round trip (argv true, TLS API)"},
		{Name: "DNS answer (zone resolver, allowed name)"},
		{Name: "event publish -> delivery (B's stream)"},
		{Name: "node API :8006 (new connection, uplink)", Goal: 20 * time.Millisecond},
		{Name: "daemon API (GET sandbox, TLS)", Goal: 20 * time.Millisecond},
	}
	probes := []func(context.Context) (time.Duration, error){p.Exec, p.DNS, nil, p.NodeAPI, p.DaemonAPI}
	measure := func(attacked bool) error {
		for i, probe := range probes {
			f := &figs[i]
			sample := func(d time.Duration, err error) error {
				switch {
				case err == nil && attacked:
					f.Attacked = append(f.Attacked, d)
				case err == nil:
					f.Alone = append(f.Alone, d)
				case !attacked:
					return fmt.Errorf("%s with nobody attacking: %w", f.Name, err)
				default:
					if f.Failed == 0 {
						f.FirstFail = err.Error()
					}
					f.Failed++
				}
				return nil
			}
			if probe == nil {
				for range o.Events {
					ds, err := p.EventCycle(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: tenantbed.Template}}})
					if err != nil {
						if err := sample(0, err); err != nil {
							return err
						}
						continue
					}
					for _, d := range ds {
						_ = sample(d, nil)
					}
				}
				continue
			}
			for range o.Rounds {
				if err := sample(probe(ctx)); err != nil {
					return err
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
			}
		}
		return nil
	}
	if err := measure(false); err != nil {
		return Result{}, err
	}
	reqA := apitype.CreateRequest{Egress: &apitype.EgressPolicy{Mode: "allowlist", Allow: []string{"*." + testvm.InternetName}}}
	for range o.AttackVMs {
		reqA.VMs = append(reqA.VMs, apitype.VMRequest{Template: tenantbed.Template})
	}
	sa, err := a.Create(ctx, reqA)
	if err != nil {
		return Result{}, fmt.Errorf("tenant A's sandbox: %w", err)
	}
	defer deleteSandbox(a, sa.ID)
	ao := o.Attack
	if ao.Flood == 0 {
		ao.Flood = 5 * time.Minute // ended by Stop and the delete, not by its clock
	}
	att, err := tenantbed.StartAttack(ctx, a, sa, ao)
	if err != nil {
		return Result{}, err
	}
	merr := measure(true)
	r := Result{Figures: figs, Attack: att.Stop(), Options: ao, VMs: o.AttackVMs}
	if merr != nil {
		return r, merr
	}
	r.Print(w)
	return r, nil
}

func deleteSandbox(c *client.Client, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_ = c.Delete(ctx, id)
}
