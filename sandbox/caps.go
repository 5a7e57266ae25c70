package sandbox

import (
	"errors"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Caps are the resource guard's limits; 0 means unlimited.
type Caps struct {
	SandboxVCPUs     int `json:"sandbox_vcpus"`
	SandboxMemoryMiB int `json:"sandbox_memory_mib"`
	SandboxVMs       int `json:"sandbox_vms"`
	NodeVCPUs        int `json:"node_vcpus"`
	NodeMemoryMiB    int `json:"node_memory_mib"`
	NodeVMs          int `json:"node_vms"`
	NodeSandboxes    int `json:"node_sandboxes"`
}

// guardLocked checks the caps for a new sandbox and counts a refusal;
// call with m.mu held.
func (m *Engine) guardLocked(req *apitype.CreateRequest) error {
	err := m.capsLocked(req)
	var ce *CapError
	if errors.As(err, &ce) {
		m.met.guardRefusals.WithLabelValues(ce.Cap).Inc()
	}
	return err
}

// capsLocked checks the caps for a new sandbox: sandboxes and warm pool
// members count against the node caps (a member giving way to a cold
// create, pool.go, no longer does); call with m.mu held.
func (m *Engine) capsLocked(req *apitype.CreateRequest) error {
	c := m.o.Caps
	var cores, mem int
	for _, v := range req.VMs {
		cores += v.Cores
		mem += v.MemoryMiB
	}
	nodeCores, nodeMem, nodeVMs, nodeSbx := cores, mem, len(req.VMs), 1
	for _, set := range []map[string]*record{m.sbx, m.members} {
		for _, r := range set {
			if r.member != nil && r.member.yielding {
				continue
			}
			for _, v := range r.VMs {
				nodeCores += v.Cores
				nodeMem += v.MemoryMiB
			}
			nodeVMs += len(r.VMs)
			nodeSbx++
		}
	}
	refuse := func(cp string, want, limit int) error {
		return &CapError{Cap: cp, Need: want, Limit: limit}
	}
	switch {
	case c.SandboxVMs > 0 && len(req.VMs) > c.SandboxVMs:
		return refuse("sandbox_vms", len(req.VMs), c.SandboxVMs)
	case c.SandboxVCPUs > 0 && cores > c.SandboxVCPUs:
		return refuse("sandbox_vcpus", cores, c.SandboxVCPUs)
	case c.SandboxMemoryMiB > 0 && mem > c.SandboxMemoryMiB:
		return refuse("sandbox_memory_mib", mem, c.SandboxMemoryMiB)
	case c.NodeSandboxes > 0 && nodeSbx > c.NodeSandboxes:
		return refuse("node_sandboxes", nodeSbx, c.NodeSandboxes)
	case c.NodeVMs > 0 && nodeVMs > c.NodeVMs:
		return refuse("node_vms", nodeVMs, c.NodeVMs)
	case c.NodeVCPUs > 0 && nodeCores > c.NodeVCPUs:
		return refuse("node_vcpus", nodeCores, c.NodeVCPUs)
	case c.NodeMemoryMiB > 0 && nodeMem > c.NodeMemoryMiB:
		return refuse("node_memory_mib", nodeMem, c.NodeMemoryMiB)
	}
	return nil
}
