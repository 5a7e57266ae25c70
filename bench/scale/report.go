package scale

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/bench"
)

// figure is one printed line: a name and its value at one size.
type figure struct {
	name string
	val  time.Duration
	goal time.Duration // 0: none
}

func (r SizeResult) figures() []figure {
	return []figure{
		{"start to ready", r.StartToReady, 0},
		{"new bridge -> zone peers p50", bench.Quantile(r.NewBridge, 0.5), 0},
		{"new bridge -> zone peers p99", bench.Quantile(r.NewBridge, 0.99), GoalNewBridgeP99},
		{fmt.Sprintf("burst of %d -> all in zone peers", r.BurstSize), r.Burst, GoalBurst},
		{"burst: slowest bridge after its creation", r.BurstSlowest, 0},
		{"port moved -> guest_ports p50", bench.Quantile(r.PortMoved, 0.5), 0},
		{"port moved -> guest_ports p99", bench.Quantile(r.PortMoved, 0.99), 0},
		{"zone added -> zone peers p50", bench.Quantile(r.ZoneAdded, 0.5), 0},
		{"zone added -> zone peers p99", bench.Quantile(r.ZoneAdded, 0.99), 0},
		{"lockdown flip -> lockdown set p50", bench.Quantile(r.Lockdown, 0.5), 0},
		{"lockdown flip -> lockdown set p99", bench.Quantile(r.Lockdown, 0.99), GoalLockdownP99},
	}
}

func (r SizeResult) print(w io.Writer) {
	fmt.Fprintf(w, "%d bridges, %d guest ports (%d links): %d single new bridges, %d changes each; load average %s\n",
		r.Bridges, r.Ports, r.Links, len(r.NewBridge), len(r.Lockdown), loadAverage())
	for _, f := range r.figures() {
		fmt.Fprintf(w, "  %-40s %10s\n", f.name, f.val.Round(10*time.Microsecond))
	}
	fmt.Fprintf(w, "  (new bridges timed from the kernel's creation of each; the kernel took %v to create the burst;\n"+
		"   in zone before the bridge existed, the running config read first: %d of %d single, %d of %d in the burst)\n",
		r.BurstMade.Round(time.Millisecond), r.Early, len(r.NewBridge), r.BurstEarly, r.BurstSize)
}

func (res *Result) printRatios(w io.Writer) {
	if len(res.Sizes) < 2 {
		return
	}
	lo, hi := res.Sizes[0], res.Sizes[len(res.Sizes)-1]
	fmt.Fprintf(w, "ratio %d/%d bridges, and the goals at %d:\n", hi.Bridges, lo.Bridges, hi.Bridges)
	lf := lo.figures()
	for i, f := range hi.figures() {
		ratio := "n/a"
		if lf[i].val > 0 {
			ratio = fmt.Sprintf("%.2fx", float64(f.val)/float64(lf[i].val))
		}
		goal := ""
		if f.goal > 0 {
			verdict := "met"
			if f.val >= f.goal {
				verdict = "MISSED"
			}
			goal = fmt.Sprintf("  goal < %v: %s", f.goal, verdict)
		}
		fmt.Fprintf(w, "  %-40s %8s%s\n", f.name, ratio, goal)
	}
}

// loadAverage is the machine's 1-minute load average, for reading the
// figures (wall-clock times on a shared machine).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.SplitN(string(b), " ", 2)[0]
}
