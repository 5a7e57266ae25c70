package apitype

// Capacity is GET /v1/capacity: what the node's resource guard (the
// daemon's [caps]) still admits, so that a client spreading work over
// several nodes sends each sandbox to one with room. Counts include
// sandboxes being created and deleted (the guard counts them too).
type Capacity struct {
	Node string `json:"node"`
	// Used is what every sandbox of the node holds now (all owners: the
	// guard's caps are node-wide, so is the room left).
	Used CapacityUse `json:"used"`
	// Limits are the node caps; a zero field is unlimited.
	Limits CapacityUse `json:"limits"`
	// Free is Limits minus Used, never below 0; -1 for an unlimited cap.
	Free CapacityUse `json:"free"`
	// Sandbox are the caps on one sandbox (0: unlimited): a create over
	// them is refused on every node with these caps.
	Sandbox SandboxCaps `json:"sandbox"`
	// FreeSandboxes is how many more sandboxes of the smallest shape (one
	// VM of one core and 16 MiB) the node admits now, the least of the
	// free sandboxes, VMs, cores and memory; -1 when nothing bounds it.
	// A client with a known shape computes its own with Fits.
	FreeSandboxes int `json:"free_sandboxes"`
}

// CapacityUse counts sandboxes, VMs, cores and memory.
type CapacityUse struct {
	Sandboxes int `json:"sandboxes"`
	VMs       int `json:"vms"`
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memory_mib"`
}

// SandboxCaps are the per-sandbox caps of the guard; 0 is unlimited.
type SandboxCaps struct {
	VMs       int `json:"vms"`
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memory_mib"`
}

// Fits is how many more sandboxes of shape (its Sandboxes field ignored:
// one sandbox of VMs VMs, VCPUs cores and MemoryMiB MiB in all) the node
// admits now: 0 when the shape is over a per-sandbox cap or no room is
// left, -1 when nothing bounds it.
func (c Capacity) Fits(shape CapacityUse) int {
	for _, p := range [][2]int{{shape.VMs, c.Sandbox.VMs}, {shape.VCPUs, c.Sandbox.VCPUs}, {shape.MemoryMiB, c.Sandbox.MemoryMiB}} {
		if p[1] > 0 && p[0] > p[1] {
			return 0
		}
	}
	n := c.Free.Sandboxes
	for _, p := range [][2]int{{c.Free.VMs, shape.VMs}, {c.Free.VCPUs, shape.VCPUs}, {c.Free.MemoryMiB, shape.MemoryMiB}} {
		free, each := p[0], p[1]
		if free < 0 || each <= 0 {
			continue
		}
		if k := free / each; n < 0 || k < n {
			n = k
		}
	}
	return n
}
