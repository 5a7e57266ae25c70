package sandbox

import "github.com/pve-inspect/pve-inspect/sandboxapi/apitype"

// Capacity is the guard's room now: what every sandbox holds (those being
// created or deleted too, as guardLocked counts them) against the caps.
// FreeSandboxes is left 0: its shape (the smallest VM a create admits) is
// the API's rule, and the API fills it.
func (m *Engine) Capacity() apitype.Capacity {
	c := m.o.Caps
	out := apitype.Capacity{
		Node:    m.o.Node,
		Limits:  apitype.CapacityUse{Sandboxes: c.NodeSandboxes, VMs: c.NodeVMs, VCPUs: c.NodeVCPUs, MemoryMiB: c.NodeMemoryMiB},
		Sandbox: apitype.SandboxCaps{VMs: c.SandboxVMs, VCPUs: c.SandboxVCPUs, MemoryMiB: c.SandboxMemoryMiB},
	}
	m.mu.Lock()
	out.Used.Sandboxes = len(m.sbx)
	for _, r := range m.sbx {
		out.Used.VMs += len(r.VMs)
		for _, v := range r.VMs {
			out.Used.VCPUs += v.Cores
			out.Used.MemoryMiB += v.MemoryMiB
		}
	}
	m.mu.Unlock()
	free := func(limit, used int) int {
		if limit <= 0 {
			return -1
		}
		return max(limit-used, 0)
	}
	out.Free = apitype.CapacityUse{
		Sandboxes: free(c.NodeSandboxes, out.Used.Sandboxes),
		VMs:       free(c.NodeVMs, out.Used.VMs),
		VCPUs:     free(c.NodeVCPUs, out.Used.VCPUs),
		MemoryMiB: free(c.NodeMemoryMiB, out.Used.MemoryMiB),
	}
	return out
}
