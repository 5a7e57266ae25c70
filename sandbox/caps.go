package sandbox

import (
	"errors"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Caps are the resource guard's limits; 0 means unlimited. The Owner
// caps bound what one owner's sandboxes hold together (sandboxes without
// an owner are one owner, "-"), so that one owner cannot fill the node:
// a create or a warm pool claim counts against its owner's caps; the pool's
// unclaimed members count against the node caps only. WithOwnerDefaults
// gives the daemon's defaults, a quarter of each node cap.
type Caps struct {
	SandboxVCPUs     int `json:"sandbox_vcpus"`
	SandboxMemoryMiB int `json:"sandbox_memory_mib"`
	SandboxVMs       int `json:"sandbox_vms"`
	NodeVCPUs        int `json:"node_vcpus"`
	NodeMemoryMiB    int `json:"node_memory_mib"`
	NodeVMs          int `json:"node_vms"`
	NodeSandboxes    int `json:"node_sandboxes"`
	OwnerVCPUs       int `json:"owner_vcpus"`
	OwnerMemoryMiB   int `json:"owner_memory_mib"`
	OwnerVMs         int `json:"owner_vms"`
	OwnerSandboxes   int `json:"owner_sandboxes"`
}

// WithOwnerDefaults returns c with each unset (0) owner cap set to a
// quarter of its node cap, rounded up (unset too when the node cap is):
// four owners at their full share fit on the node.
func (c Caps) WithOwnerDefaults() Caps {
	for _, p := range []struct {
		owner *int
		node  int
	}{
		{&c.OwnerVCPUs, c.NodeVCPUs}, {&c.OwnerMemoryMiB, c.NodeMemoryMiB}, {&c.OwnerVMs, c.NodeVMs}, {&c.OwnerSandboxes, c.NodeSandboxes},
	} {
		if *p.owner == 0 {
			*p.owner = (p.node + 3) / 4
		}
	}
	return c
}

// sameOwner tells whether two sandbox owners are one: "" and "-" are the
// owner of the sandboxes created without one.
func sameOwner(a, b string) bool {
	norm := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	return norm(a) == norm(b)
}

// guardLocked checks the caps for a new sandbox and counts a refusal;
// call with m.mu held.
func (m *Engine) guardLocked(req *apitype.CreateRequest) error {
	err := m.capsLocked(req, true)
	var ce *CapError
	if errors.As(err, &ce) {
		m.met.guardRefusals.WithLabelValues(ce.Cap).Inc()
	}
	return err
}

// capsLocked checks the caps for a new sandbox: sandboxes and warm pool
// members count against the node caps (a member giving way to a cold
// create or being claimed, pool.go, no longer does), and with owned (a
// create or a claim, not a pool member) req's owner's sandboxes and req
// against the owner caps; call with m.mu held.
func (m *Engine) capsLocked(req *apitype.CreateRequest, owned bool) error {
	sandbox, nodeCaps, ownerCaps := m.o.Caps.scopes()
	want := wantOf(req)
	node, own := want, want
	for _, set := range []map[string]*record{m.sbx, m.members} {
		for _, r := range set {
			if r.member != nil && r.member.yielding {
				continue
			}
			node.record(r)
			if owned && r.member == nil && sameOwner(r.Owner, req.Owner) {
				own.record(r)
			}
		}
	}
	if err := want.over(sandbox); err != nil {
		return err
	}
	if err := node.over(nodeCaps); err != nil || !owned {
		return err
	}
	return own.over(ownerCaps)
}

// alone is the CapError of the first cap req passes on its own: a
// per-sandbox cap, or a node or owner cap with nothing else on the node
// (a create no wait admits); nil when none.
func (c Caps) alone(req *apitype.CreateRequest) error {
	want := wantOf(req)
	sandbox, node, owner := c.scopes()
	for _, l := range []capLimits{sandbox, node, owner} {
		if err := want.over(l); err != nil {
			return err
		}
	}
	return nil
}

// scopes are c's limits of one sandbox, the node and an owner.
func (c Caps) scopes() (sandbox, node, owner capLimits) {
	return capLimits{"sandbox", 0, c.SandboxVMs, c.SandboxVCPUs, c.SandboxMemoryMiB},
		capLimits{"node", c.NodeSandboxes, c.NodeVMs, c.NodeVCPUs, c.NodeMemoryMiB},
		capLimits{"owner", c.OwnerSandboxes, c.OwnerVMs, c.OwnerVCPUs, c.OwnerMemoryMiB}
}

// wantOf is what a sandbox of req holds.
func wantOf(req *apitype.CreateRequest) capUse {
	var want capUse
	for _, v := range req.VMs {
		want.add(v.Cores, v.MemoryMiB, 1)
	}
	want.sandboxes = 1
	return want
}

// capUse is what sandboxes hold, summed for a cap.
type capUse struct{ sandboxes, vms, vcpus, memoryMiB int }

func (u *capUse) add(cores, mem, vms int) {
	u.vcpus += cores
	u.memoryMiB += mem
	u.vms += vms
}

// record adds r's VMs and r.
func (u *capUse) record(r *record) {
	for _, v := range r.VMs {
		u.add(v.Cores, v.MemoryMiB, 1)
	}
	u.sandboxes++
}

// capLimits are one scope's caps (sandbox_, node_, owner_); 0 is none.
type capLimits struct {
	scope                        string
	sandboxes, vms, vcpus, memMi int
}

// over is the CapError of the first cap of l that u passes, or nil.
func (u capUse) over(l capLimits) error {
	for _, c := range []struct {
		name        string
		have, limit int
	}{{"sandboxes", u.sandboxes, l.sandboxes}, {"vms", u.vms, l.vms}, {"vcpus", u.vcpus, l.vcpus}, {"memory_mib", u.memoryMiB, l.memMi}} {
		if c.limit > 0 && c.have > c.limit {
			return &CapError{Cap: l.scope + "_" + c.name, Need: c.have, Limit: c.limit}
		}
	}
	return nil
}
