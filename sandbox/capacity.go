package sandbox

import "github.com/pve-inspect/pve-inspect/sandboxapi/apitype"

// Capacity is the guard's room now: what every sandbox holds (those being
// created or deleted too, as guardLocked counts them) against the caps.
// FreeSandboxes is left 0: its shape (the smallest VM a create admits) is
// the API's rule, and the API fills it.
func (m *Engine) Capacity() apitype.Capacity { return m.CapacityFor("", false) }

// CapacityFor is Capacity with Free narrowed, when owned, to what owner's
// caps still admit (the owner caps, caps.go; "" and "-" are one owner), so
// that a client placing sandboxes for owner is told the room its creates
// will find rather than the node's.
func (m *Engine) CapacityFor(owner string, owned bool) apitype.Capacity {
	c := m.o.Caps
	out := apitype.Capacity{
		Node:    m.o.Node,
		Limits:  apitype.CapacityUse{Sandboxes: c.NodeSandboxes, VMs: c.NodeVMs, VCPUs: c.NodeVCPUs, MemoryMiB: c.NodeMemoryMiB},
		Sandbox: apitype.SandboxCaps{VMs: c.SandboxVMs, VCPUs: c.SandboxVCPUs, MemoryMiB: c.SandboxMemoryMiB},
	}
	var own apitype.CapacityUse
	m.mu.Lock()
	out.Used.Sandboxes = len(m.sbx)
	for _, r := range m.sbx {
		out.Used.VMs += len(r.VMs)
		mine := owned && sameOwner(r.Owner, owner)
		if mine {
			own.Sandboxes++
			own.VMs += len(r.VMs)
		}
		for _, v := range r.VMs {
			out.Used.VCPUs += v.Cores
			out.Used.MemoryMiB += v.MemoryMiB
			if mine {
				own.VCPUs += v.Cores
				own.MemoryMiB += v.MemoryMiB
			}
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
	if owned {
		narrow := func(node *int, limit, used int) {
			if f := free(limit, used); f >= 0 && (*node < 0 || f < *node) {
				*node = f
			}
		}
		narrow(&out.Free.Sandboxes, c.OwnerSandboxes, own.Sandboxes)
		narrow(&out.Free.VMs, c.OwnerVMs, own.VMs)
		narrow(&out.Free.VCPUs, c.OwnerVCPUs, own.VCPUs)
		narrow(&out.Free.MemoryMiB, c.OwnerMemoryMiB, own.MemoryMiB)
	}
	return out
}
