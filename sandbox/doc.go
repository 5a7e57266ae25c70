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
//	sharedvnets.go  NICs on the operator's vnets ([api] shared_vnets; design decisions there)
//	env.go          a create's secrets file in the guest
//	names.go        VM addresses from Proxmox's IPAM; hostnames and /etc/hosts in the guests
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
//     the VM's cgroup and taps (a container's lxc/<vmid> and veths) decide;
//     what the agent reports of the guest is kept apart (guest_reported)
//     and can only degrade a VM, since a hostile guest can lie about
//     itself. Only exec and file calls (and the
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
//
// # What is kept about an instance
//
// Proxmox hands a freed VMID to the next clone, and with it the agent
// socket path (<QGADir>/<vmid>.qga) and the tap names (tap<vmid>i<n>); an
// auto CIDR freed by a delete is handed to the next sandbox, and with it
// its addresses. So nothing the daemon keeps about a VM or sandbox may be
// found again by a VMID, socket path or address alone once the instance is
// gone (issue 34: a per-socket exec environment cache ran one tenant's
// PATH and BASH_ENV in the next tenant's VM). An instance is a sandbox
// record: its id is random ("sb" and 6 characters), never that of a live
// sandbox or pool member, and the zone, vnets, VM names and tags derive
// from it. The audit of every such cache, pool, counter and record, as
// "what: keyed by; dropped when (file)":
//
// The engine (this package):
//   - Sandbox records, Engine.sbx: by sandbox id; removed by forget in the
//     same critical section as the record's health track, when a delete
//     or a failed create ends (engine.go, delete.go, create.go).
//   - Pool members, Engine.members: by member id; removed when a member is
//     retired (forgetMember), or moved to Engine.sbx by a claim, keeping
//     its id, so what was keyed by that id during the pool period (egress
//     denials, below) meets the claimer (pool.go, poolrefill.go).
//   - State-file records: by sandbox id, each with its VMIDs; the file is
//     rewritten on every change and a record goes with forget or
//     forgetMember; after a restart a VM is adopted only when its Proxmox
//     tags name the sandbox id (pvei-s-<id>), never by VMID alone
//     (statefile.go, reconcile.go).
//   - Reserved VMIDs, Engine.reserved: by VMID, only between NextID and the
//     clone that takes it (create.go).
//   - Health tracks, healthMonitor.sb (health, agent silence, OOM
//     baseline, expiry and denial event state): by sandbox id and VM name,
//     made only while Engine.sbx holds the round's very record; dropped
//     with the record (forget), and by the next round for any sandbox no
//     longer ready; a round that overlaps the delete neither remakes nor
//     folds into a dropped track (health.go).
//   - Per-sandbox series, pve_inspect_sandbox_vm_* (labels sandbox, vm,
//     vmid, owner): collected from the health tracks, gone with them
//     (healthmetrics.go). The engine's other series are by state, cap or
//     pool shape, never by instance (metrics.go, pool.go).
//   - Health holds, healthMonitor.held, and busy marks, vmBusy.by: by VMID,
//     but only inside an operation begun with Begin (a rollback, a
//     snapshot, a disk transfer); a delete cancels and waits for the
//     sandbox's operations before it stops a VM, so both are released
//     before the VMID can be freed (health.go, disktransfer.go, ops.go).
//   - Events: a bounded buffer (HealthOptions.EventBuffer) kept per owner,
//     each event naming its sandbox id and owner; not dropped by a delete,
//     aged out by newer events of the owner holding the most; a filter by sandbox id never matches the next sandbox on the
//     VMID (events.go).
//
// The guest agent client (qga):
//   - Per-socket locks, Client.locks: by socket path, no data; an entry
//     lives while a call holds or waits for it. The calls of an operation
//     end before the delete stops the VM; a health ping that overlaps a
//     delete is bounded by HealthOptions.PingTimeout and its answer lands
//     in a dropped track (client.go).
//   - Exec environments: none. The base environment of every command is
//     fixed on the daemon's side (qga.BaseEnv: PATH, HOME=/root,
//     LANG=C.UTF-8, plus the request's env); nothing a guest prints
//     becomes part of another call (execenv.go).
//   - Reply buffers, BufferedBytes: a node-wide count, no key.
//
// Disk transfers (diskxfer): one lock per VM, Transfer.slots: by VMID, no
// data; an entry lives while a transfer holds or waits for it
// (diskxfer.go).
//
// The API (sandboxapi): exec and file slots and the collected-output
// budget are held for the duration of one call and keyed by no instance
// (server.go); the per-owner shares of issue 34 count by owner.
//
// Egress (firewall/egress, listed here, changed there):
//   - Registry.zones (policy, owner, bridges): by zone (= sandbox id);
//     removed by the sandbox's delete (removeEgress) (registry.go).
//   - Registry.learned and the kernel's learned set elements: by guest
//     interface (the zone's bridges, vnet names from the sandbox id);
//     dropped at every policy change and removal (changedLocked,
//     Guard.Forget) (registry.go).
//   - Registry.gen: by guest interface; a new generation at every policy
//     change (no answer asked under an older one is learned), dropped
//     with the zone's Remove (registry.go).
//   - Denials.recent and the counters pve_inspect_egress_denied_total and
//     pve_inspect_egress_quota_refused_total: by sandbox id (the egress
//     owner); dropped, series deleted, when the sandbox's policy is
//     removed (Egress.Remove calls Forget) and when a pool member is
//     claimed (Registry.Begin: the claimer starts clean), and for a zone
//     the daemon did not create when it leaves the node (ZonesGone)
//     (denials.go, registry.go).
//   - The egress record, Log.rings (records, counts, the series of
//     pve_inspect_egress_record_bytes_total, _records_total and
//     _records_dropped_total, read from the rings at scrape time): by
//     sandbox id, a ring per instance (its Gen); dropped with the
//     sandbox's policy (Egress.Remove) and at a pool claim (OnDrop), or,
//     for DeleteKeepingEgress, taken out just before (Log.Take) and held
//     by the delete's answer, still counted in the node's bound, until it
//     is written (EgressHandover.Release). Its
//     files (LogStore, [api] state_dir/egress-log/<id>.json): removed at
//     the next save after the ring is dropped, and at a start for every
//     sandbox the engine's reconcile did not keep (EgressRestorer)
//     (log.go, logcount.go, logstore.go).
//   - egressEvents.sent (egressevents.go): by sandbox id and record
//     instance; dropped at the sandbox's delete (its last egress event)
//     and by the next round once the sandbox is no longer in the table.
//   - KernelDrops.ifs and .dests: by interface name (and address); rebuilt
//     from the kernel's counters on every poll (2 s), attributed to the
//     owner of the interface at poll time; drops read across a policy
//     change are a new baseline, not counted for the new owner, and a
//     refused flow record goes to the owner's ring only while the
//     generation it was attributed under is current (kernel.go).
//   - The proxy's live connections, proxy.live: by guest interface, cut at
//     every policy change; its quota, by owner, released per connection
//     (proxy.go, quota.go).
//   - LeaseNames.cache (names guests took by DHCP): by zone (= sandbox
//     id); an expired lease names nothing, a replaced lease file is
//     re-read, and what was read of a zone goes with the zone
//     (zonenames.go).
//   - The resolver's interface index -> name and owner memory: at most
//     1 s, looked up again at once on a policy change (resolver.go).
//
// DHCP leases and names of a reused address: each sandbox has its own
// zone, named by its id, so its own dnsmasq instance and lease file
// (Proxmox SDN's dnsmasq plugin, one instance per zone); a reused CIDR
// meets a fresh zone. Its IPAM entries go with the subnets at teardown
// (Proxmox refuses a subnet delete while IPAM holds entries in it:
// e2e TestEmulatorIPAMEntriesBlockSubnetDelete).
package sandbox
