package sandbox_test

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestHealthContainer: a container member's host signals are its
// container's counters (NodeStats.CTStats: its cgroup lxc/<vmid> and its
// veths), a VM member's its VM's (VMStats), each read through its own
// call; the container's per-sandbox series carry them like a VM's; and a
// container whose cgroup and veths cannot be read says so in Missing
// without changing its verdict.
func TestHealthContainer(t *testing.T) {
	ctx := context.Background()
	b := newCTBench(t, ctConf)
	node := &nodeStats{st: map[int]sandbox.VMStats{}, ct: map[int]sandbox.VMStats{}}
	reg := prometheus.NewRegistry()
	b.o.Health = sandbox.HealthOptions{Node: node}
	b.o.Registerer = reg
	e := b.engine(t)
	sb, err := e.Create(ctx, mixed())
	if err != nil {
		t.Fatal(err)
	}
	vm, ct := sb.VMs[0], sb.VMs[1]
	vmStats := sandbox.VMStats{CPUSeconds: 2, MemoryBytes: 300 << 20, NetBytesToGuest: 10, NetBytesFromGuest: 20}
	ctStats := sandbox.VMStats{CPUSeconds: 0.25, MemoryBytes: 21 << 20, MemoryPeakBytes: 30 << 20, DiskWriteBytes: 4096,
		NetBytesToGuest: 1500, NetBytesFromGuest: 700, NetPacketsToGuest: 12, NetPacketsFromGuest: 9}
	node.set(vm.VMID, vmStats)
	node.mu.Lock()
	node.ct[ct.VMID] = ctStats
	node.mu.Unlock()

	e.CheckHealth(ctx)
	h, ok := e.Health(sb.ID)
	if !ok || h.State != apitype.HealthOK || len(h.VMs) != 2 {
		t.Fatalf("health %+v (%v)", h, ok)
	}
	byName := map[string]apitype.VMHealth{}
	for _, v := range h.VMs {
		byName[v.Name] = v
	}
	got := byName[ct.Name].Host
	if got.Status != "running" || !got.AgentOK || got.CPUSeconds != 0.25 || got.MemoryBytes != 21<<20 || got.MemoryPeakBytes != 30<<20 ||
		got.DiskWriteBytes != 4096 || got.NetBytesToGuest != 1500 || got.NetBytesFromGuest != 700 || got.NetPacketsToGuest != 12 ||
		got.NetPacketsFromGuest != 9 || len(got.Missing) != 0 {
		t.Errorf("container's host signals %+v, want its container's counters", got)
	}
	if v := byName[vm.Name].Host; v.MemoryBytes != 300<<20 || v.NetBytesFromGuest != 20 || len(v.Missing) != 0 {
		t.Errorf("VM's host signals %+v, want its VM's counters", v)
	}

	// the series of the container: its memory and network counters
	series := testkit.Series(t, reg, map[string]string{"sandbox": sb.ID, "vm": ct.Name, "vmid": strconv.Itoa(ct.VMID)})
	for name, want := range map[string]float64{
		"pve_inspect_sandbox_vm_memory_bytes":                                21 << 20,
		"pve_inspect_sandbox_vm_cpu_seconds_total":                           0.25,
		`pve_inspect_sandbox_vm_network_bytes_total{direction="to_guest"}`:   1500,
		`pve_inspect_sandbox_vm_network_bytes_total{direction="from_guest"}`: 700,
		"pve_inspect_sandbox_vm_agent_up":                                    1,
	} {
		if got, ok := series[name]; !ok || got != want {
			t.Errorf("container series %s = %v (%v), want %v", name, got, ok, want)
		}
	}

	// nothing readable: named, and the verdict stays ok
	node.mu.Lock()
	delete(node.ct, ct.VMID)
	node.mu.Unlock()
	e.CheckHealth(ctx)
	h, _ = e.Health(sb.ID)
	for _, v := range h.VMs {
		if v.Name == ct.Name && (!slices.Equal(v.Host.Missing, []string{"cgroup", "veths"}) || v.State != apitype.HealthOK) {
			t.Errorf("container without counters: %s, missing %v", v.State, v.Host.Missing)
		}
	}
	if err := e.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
