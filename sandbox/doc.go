// Package sandbox is the sandbox engine of DESIGN.md section 5: it owns
// the sandboxes of this node (an SDN zone plus linked-clone VMs), their
// lifecycle and the operations on their VMs, and knows nothing of HTTP.
// The HTTP face is sandboxapi, the wire types sandboxapi/apitype (as
// tailscale's ipnlocal sits between ipn and localapi).
//
// Where things are, one file per object the engine manages:
//
//	engine.go       Options, Engine (its mutexes and lock order), the sandbox table
//	errors.go       sentinel and typed errors (what the HTTP layer maps to problems)
//	proxmox.go      the small Proxmox interfaces, one per step that calls Proxmox
//	guest.go        the Guest interface, dialing, waiting for the agent
//	check.go        the Checker interface and Check
//	tags.go         ownership tags, ids and names
//	caps.go         the resource guard
//	cidr.go         the CIDR plan: auto ranges, overlap checks, gateway and DHCP range
//	create.go       Create: zone, vnets, subnets, VMs
//	delete.go       Delete and teardown
//	ops.go          Begin: operations on a ready sandbox's VM, cancelled by a delete
//	snapshot.go     snapshots and rollbacks
//	reap.go         Extend and the TTL reaper
//	zones.go        SDN apply (concurrent callers share one) and the zone set handed to the host guard
//	egress.go       egress policies (the Egress interface)
//	env.go          a create's secrets file in the guest
//	harden.go       the hardened VM profile (the VMConfigs interface)
//	disktransfer.go files through a hot-plugged disk (the DiskTransfer interface)
//	statefile.go    the state file: its own versioned types, save and load
//	reconcile.go    Reconcile after a restart
//	pool.go         the warm pool: shapes, matching, claims, giving way (design decisions there)
//	poolrefill.go   the warm pool's refills, checks, retirement and re-adoption
//	metrics.go      the engine's Prometheus metrics
//	health.go       the health monitor: per-VM signals, states, BrokenError
//	healthnode.go   a VM's cgroup (qemu.slice/<vmid>.scope) and tap counters
//	healthmetrics.go the per-sandbox series (collected from the monitor)
//	events.go       the bounded event ring behind GET /v1/events
//
// Design decisions:
//
//   - Errors are sentinels (ErrUnknown, ErrConflict, the guest and Proxmox
//     sentinels) and typed errors (CapError, InvalidError,
//     NotHardenedError, ProxmoxError), never problem documents: the HTTP
//     layer turns them into problems in one place (sandboxapi/problem.go),
//     as tailscale's localapi does for ipnlocal.
//   - The interfaces the engine consumes are declared here, each with only
//     the methods its step calls (cilium's namemanager "ipc"): pveapi.Client
//     satisfies Proxmox and VMConfigs, qga.Guest satisfies Guest,
//     containment.SandboxChecker satisfies Checker, diskxfer.Transfer
//     satisfies DiskTransfer. No adapter package sits between them.
//   - Ownership: every VM carries two Proxmox tags, the node tag
//     "pvei-n-<node>" and the sandbox tag "pvei-s-<sandbox>", and is placed
//     in the daemon's pool. SDN zones cannot carry tags, so a sandbox's zone
//     id is its sandbox id and its vnets carry both tags in their alias; a
//     zone is only removed when the state file records it or a vnet in it
//     carries both tags. Cleanup never touches an object without both tags
//     of this node.
//   - A sandbox is written to the state file (state "creating") before the
//     first Proxmox object exists, so a crash mid-create is cleaned up on the
//     next start by Reconcile. The file has its own versioned types
//     (statefile.go): the wire types may change without changing the disk.
//   - Health is host-side first: Proxmox and QMP status, the agent's ping,
//     the VM's cgroup and taps decide; what the agent reports of the guest
//     is kept apart (guest_reported) and can only degrade a VM, since a
//     hostile guest can lie about itself. Only exec and file calls (and the
//     check) refuse a broken VM: snapshots, rollbacks and deletes still run,
//     as they are how a harness recovers.
//   - A delete turns the sandbox to "deleting" and cancels its operations
//     under the engine's mutex, so no operation begins after it, then waits
//     for them before it stops a VM: VM ids are reused, and a stale exec
//     must not reach the next sandbox's VM.
//   - Events are published with no engine lock held (the reaper's expired
//     goes out after the delete has turned the sandbox to deleting and
//     released Engine.mu), and a publish does O(1) work under the event
//     ring's own lock: readers copy what they have not seen under it and
//     filter outside it. No reader's filter, however many streams there
//     are, holds up a publish, and no publish holds up the engine.
package sandbox
