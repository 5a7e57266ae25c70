package apitype

import "time"

// PoolStatus is the body of GET /v1/pool: the warm pool's shapes and its
// members (ready sandboxes no one has claimed yet).
type PoolStatus struct {
	Shapes  []PoolShapeStatus `json:"shapes"`
	Members []PoolMember      `json:"members"`
}

// PoolShapeStatus is one shape of the warm pool with its counts.
type PoolShapeStatus struct {
	Name string `json:"name"`
	// Kind is the members' kind: "vm" (QEMU VMs) or "lxc" (unprivileged
	// containers); a claim serves creates of one member of that kind.
	Kind      string   `json:"kind"`
	Template  string   `json:"template"`
	Cores     int      `json:"cores"`
	MemoryMiB int      `json:"memory_mib"`
	Networks  []string `json:"networks"`
	// Egress is the policy kind a claim of this shape asks for (open,
	// none, allowlist); members wait with "none".
	Egress        string `json:"egress"`
	Target        int    `json:"target"`
	MaxAgeSeconds int64  `json:"max_age_seconds"`
	// Ready members can be claimed; Building ones are being cloned and
	// booted.
	Ready    int `json:"ready"`
	Building int `json:"building"`
	// Error, when set, is why the pool cannot build members of this
	// shape (its template unknown, of the other kind, or refused by the
	// hardening checks); it clears once a refill can.
	Error string `json:"error,omitempty"`
}

// PoolMember is one member of the warm pool.
type PoolMember struct {
	ID    string `json:"id"`
	Shape string `json:"shape"`
	// State is creating (building), ready, deleting (retiring), error
	// (a teardown that failed, retried) or yielding (giving way to a cold
	// create).
	State      string    `json:"state"`
	VMIDs      []int     `json:"vmids"`
	CIDRs      []string  `json:"cidrs"`
	CreatedAt  time.Time `json:"created_at"`
	AgeSeconds int64     `json:"age_seconds"`
	Error      string    `json:"error,omitempty"`
}
