package container

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/pve-inspect/pve-inspect/bench"
)

// Print writes the figures as a table, container beside VM with the ratio
// container / VM, then the goals' verdicts and what the VM's memory on
// the bed is.
func (r *Result) Print(w io.Writer) {
	fmt.Fprintf(w, "one-member sandboxes (%d core, %d MiB, one auto network) on the emulator and the bed, through the HTTP API;\n", cores, memoryMiB)
	fmt.Fprintf(w, "container: unprivileged LXC (pve-container's layout), entered by ctguest; VM: the bed's (a namespace with the real qemu-ga)\n")
	fmt.Fprintf(w, "%-46s %-22s %-22s %s\n", "measure", "container", "VM", "container / VM")
	row := func(name string, ct, vm []time.Duration, q float64) {
		c, v := bench.Quantile(ct, q), bench.Quantile(vm, q)
		fmt.Fprintf(w, "%-46s %-22s %-22s %s\n", name, dur(c, len(ct)), dur(v, len(vm)), ratio(float64(c), float64(v)))
	}
	row(fmt.Sprintf("cold create-to-ready p50 (%d each)", len(r.Container.Cold)), r.Container.Cold, r.VM.Cold, 0.5)
	row("cold create-to-ready p99", r.Container.Cold, r.VM.Cold, 0.99)
	row(fmt.Sprintf("exec round trip, HTTP API, p50 (%d each)", len(r.Container.ExecAPI)), r.Container.ExecAPI, r.VM.ExecAPI, 0.5)
	row("exec round trip, HTTP API, p99", r.Container.ExecAPI, r.VM.ExecAPI, 0.99)
	row("exec round trip, guest call, p50", r.Container.ExecGuest, r.VM.ExecGuest, 0.5)
	row("exec round trip, guest call, p99", r.Container.ExecGuest, r.VM.ExecGuest, 0.99)
	row(fmt.Sprintf("pool claim create-to-ready p50 (%d each)", len(r.Container.Claims)), r.Container.Claims, r.VM.Claims, 0.5)
	row("pool claim create-to-ready p99", r.Container.Claims, r.VM.Claims, 0.99)
	cm, vm := median(r.Container.IdleMemory), median(r.VM.IdleMemory)
	fmt.Fprintf(w, "%-46s %-22s %-22s %s\n", fmt.Sprintf("idle member's memory, median of %d, after %s", len(r.Container.IdleMemory), r.Settle),
		mib(cm, len(r.Container.IdleMemory)), mib(vm, len(r.VM.IdleMemory)), ratio(float64(cm), float64(vm)))
	fmt.Fprintf(w, "%-46s %-22s %-22s %s\n", "idle member's memory, max", mib(maxOf(r.Container.IdleMemory), len(r.Container.IdleMemory)),
		mib(maxOf(r.VM.IdleMemory), len(r.VM.IdleMemory)), "")
	fmt.Fprintln(w, "goals (issue 38, on the bed):")
	for _, v := range r.Verdicts() {
		fmt.Fprintf(w, "  %s\n", v)
	}
	fmt.Fprintln(w, "memory: a member's cgroup on the node (memory.current; on a hybrid host the v1 memory.usage_in_bytes): the container's lxc/<vmid>,")
	fmt.Fprintln(w, "  the bed's VM's qemu.slice/<vmid>.scope, which holds qemu-ga and its init in a namespace, no guest kernel and no QEMU: not what a VM")
	fmt.Fprintln(w, "  costs. On a Proxmox node compare /sys/fs/cgroup/lxc/<vmid>/memory.current with /sys/fs/cgroup/qemu.slice/<vmid>.scope/memory.current")
	fmt.Fprintln(w, "  (QEMU and the guest RAM it touched) for a container and a VM of the same shape, both idle after boot.")
}

// Verdicts says of each goal whether the run met it.
func (r *Result) Verdicts() []string {
	var out []string
	c50, c99 := bench.Quantile(r.Container.Cold, 0.5), bench.Quantile(r.Container.Cold, 0.99)
	switch {
	case len(r.Container.Cold) == 0:
		out = append(out, "container cold create-to-ready under 1s: MISSED: no samples")
	case c50 < ColdGoal && c99 < ColdGoal:
		out = append(out, fmt.Sprintf("container cold create-to-ready under 1s: met (p50 %s, p99 %s)", round(c50), round(c99)))
	case c50 < ColdGoal:
		out = append(out, fmt.Sprintf("container cold create-to-ready under 1s: met at p50 (%s), MISSED at p99 (%s)", round(c50), round(c99)))
	default:
		out = append(out, fmt.Sprintf("container cold create-to-ready under 1s: MISSED (p50 %s, p99 %s)", round(c50), round(c99)))
	}
	m := maxOf(r.Container.IdleMemory)
	switch {
	case len(r.Container.IdleMemory) == 0:
		out = append(out, "idle container under 32 MiB: MISSED: no samples")
	case m < IdleMemoryGoal:
		out = append(out, fmt.Sprintf("idle container under 32 MiB: met (max %s of %d)", mib(m, 1), len(r.Container.IdleMemory)))
	default:
		out = append(out, fmt.Sprintf("idle container under 32 MiB: MISSED (max %s of %d)", mib(m, 1), len(r.Container.IdleMemory)))
	}
	return out
}

func median(v []uint64) uint64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}

func maxOf(v []uint64) uint64 {
	if len(v) == 0 {
		return 0
	}
	return slices.Max(v)
}

func ratio(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fx", a/b)
}

func dur(d time.Duration, n int) string {
	if n == 0 {
		return "-"
	}
	return round(d)
}

func round(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}

func mib(b uint64, n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}
