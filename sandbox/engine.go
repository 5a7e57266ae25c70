package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/semaphore"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Options configure an Engine. Zero values take the documented defaults.
type Options struct {
	// Node is this node's id; it tags every object (required).
	Node string
	// Proxmox is the Proxmox API (required).
	Proxmox Proxmox
	// Guests dials a VM's guest agent by socket path (required).
	Guests GuestDialer
	// WinGuests dials the guest agent of a VM whose os_type is Windows
	// (qga.Client.WindowsGuests); nil: such a VM's exec and file calls
	// are refused (GuestIO), and Guests serves its pings.
	WinGuests GuestDialer
	// Containers is the Proxmox API of containers; nil: a member of kind
	// lxc is refused (ErrNotConfigured).
	Containers Containers
	// CTGuests returns the inside of container vmid, entered from the
	// node (ctguest); nil: no container is made (kind lxc is refused),
	// while those the state file records are still deleted through
	// Containers.
	CTGuests func(vmid int) Guest
	// CTSweep, when set, removes what the daemon left of its own in
	// container vmid once it is stopped, before its destroy frees the id
	// (ctguest's exec cgroups, of an exec a dead daemon left running).
	CTSweep func(vmid int) error
	// Checker runs the containment check; nil: Check fails with
	// ErrNotConfigured.
	Checker Checker
	// QGADir holds <vmid>.qga sockets (default /var/run/qemu-server).
	QGADir string
	// Pool is the Proxmox pool of every VM (default "pve-inspect").
	Pool string
	// Templates maps template names to VM ids; other names are looked up
	// with Proxmox.TemplateID.
	Templates map[string]int
	// StateDir holds the state file (default /var/lib/pve-inspectd/sandboxapi).
	StateDir string
	// Caps are the resource guard's limits.
	Caps Caps
	// ReaperInterval is how often expired sandboxes are deleted (30s).
	ReaperInterval time.Duration
	// ReapParallel is how many expired sandboxes the reaper deletes at
	// once (4), each within its own TeardownTimeout: one whose teardown
	// hangs holds one of these, not the pass and every other owner's
	// expired sandboxes behind it.
	ReapParallel int
	// DiskTransfer, when set, moves files of at least DiskThreshold bytes
	// (32 MiB by default) through a hot-plugged disk instead of the guest
	// agent (diskxfer).
	DiskTransfer  DiskTransfer
	DiskThreshold int64
	// AutoCIDRPool and AutoCIDRBits: where "auto" networks come from
	// (10.200.0.0/16 in /24s).
	AutoCIDRPool netip.Prefix
	AutoCIDRBits int
	// HostNetworks, when set, lists the host's own networks (addresses and
	// routes: hostnet.Lister.Prefixes); a create whose networks overlap one
	// is refused, and "auto" skips them. An error fails the create.
	HostNetworks func(ctx context.Context) ([]netip.Prefix, error)
	// AgentTimeout bounds the wait for a started VM's agent (5m).
	AgentTimeout time.Duration
	// CreateTimeout bounds a create (10m); TeardownTimeout a teardown (5m).
	CreateTimeout, TeardownTimeout time.Duration
	// ApplyTimeout bounds the wait for one SDN apply (30m), apart from
	// the create or teardown that asked for it: an apply's time grows with
	// every DHCP zone of the cluster on every node (each node's reload
	// restarts every zone's dnsmasq, and the nodes are visited one after
	// another), so a cluster of a few hundred zones takes minutes, and a
	// wait given up leaves the apply running while the caller fails.
	ApplyTimeout time.Duration
	// UnbatchedApplies makes every create, delete and refill run an SDN
	// apply of its own, one after another, instead of sharing one: the
	// behaviour before applies were shared, kept as the cluster bench's
	// baseline (bench/cluster). The daemon never sets it.
	UnbatchedApplies bool
	// ZonesChanged, when set, receives every sandbox zone of this node with
	// its vnet bridges whenever that set changes (after a create's SDN apply,
	// before its VMs start; after a delete; after Reconcile). The daemon
	// passes it to the host guard (firewall.Guard.SetZones) so a sandbox's
	// own vnets may forward to each other. An error fails the create.
	ZonesChanged func(ctx context.Context, zones map[string][]string) error
	// BridgeUp, when set, says whether a vnet's bridge exists on this
	// node. After each SDN apply a create or refill made, the engine
	// checks its vnets' bridges and applies again (BridgeRetries times)
	// when one is missing: an apply whose node reload ran while another
	// client's did ends OK with nothing made (ifupdown2's lock does not
	// wait). nil skips the check.
	BridgeUp func(ctx context.Context, bridge string) (bool, error)
	// BridgeRetries is how many more applies a missing bridge gets (3).
	BridgeRetries int
	// GatewayUp, when set (with BridgeUp), says whether a vnet's bridge
	// is on this node carrying its subnet's gateway address: proof that
	// a network reload made it from a running configuration holding the
	// subnet (pve-network Zones/SimplePlugin.pm puts "address <gateway>"
	// on the bridge; the zone's DHCP configuration is regenerated in the
	// same reload). It lets the engine share another client's apply: when
	// that apply has already committed every SDN edit of this engine's
	// batch, the engine waits for its reload to reach this node instead
	// of applying again (a second apply of the whole cluster for nothing);
	// when the reload does not come in time, it applies after all.
	GatewayUp func(ctx context.Context, bridge string, gateway netip.Addr) (bool, error)
	// Egress, when set, enforces sandboxes' egress policies (create's
	// egress object, SetEgress); nil refuses them.
	Egress Egress
	// VMConfigs, when set, reads and changes VM configurations for the
	// hardened VM profile (hardening): every clone gets what the
	// pool-scoped token may set, and a create from a template that fails
	// the profile's root-only items is refused (NotHardenedError) unless
	// AllowUnhardenedTemplates.
	VMConfigs VMConfigs
	// AllowUnhardenedTemplates ([api] require_hardened_templates = false)
	// lets a create clone a template that fails the profile.
	AllowUnhardenedTemplates bool
	// AllowUEFI ([api] allow_uefi) lets a create ask for firmware "uefi"
	// (vmoptions.go); refused otherwise.
	AllowUEFI bool
	// AllowWindows ([api] allow_windows) lets a create ask for a Windows
	// os_type; refused otherwise.
	AllowWindows bool
	// AllowE1000 ([api] allow_e1000) lets a create ask for nic_controller
	// "e1000" (QEMU's emulated Intel NIC); refused otherwise.
	AllowE1000 bool
	// SharedVNets ([api] shared_vnets) are the Proxmox vnets, by id, a
	// sandbox's NICs may be on (apitype.NIC.VNet; sharedvnets.go).
	SharedVNets []string
	// HostInterfaces, when set, names the host guard's management and
	// trusted interfaces: never shared, whatever SharedVNets says.
	HostInterfaces func() []string
	// Health configures the health monitor and the event buffer
	// (health.go, events.go).
	Health HealthOptions
	// WarmPool lists the shapes of the warm pool ([pool] shape): whole
	// sandboxes built ahead, claimed by a matching create (pool.go).
	WarmPool []PoolShape
	// PoolInterval is how often the pool checks its members and refills
	// (10s); a claim also wakes it.
	PoolInterval time.Duration
	// Now is the clock (time.Now).
	Now func() time.Time
	// Registerer receives the metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Logger is the structured logger (slog.Default()).
	Logger *slog.Logger
}

func (o *Options) defaults() error {
	if o.Node == "" || o.Proxmox == nil || o.Guests == nil {
		return errors.New("sandbox: Node, Proxmox and Guests are required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if o.QGADir == "" {
		o.QGADir = "/var/run/qemu-server"
	}
	if o.Pool == "" {
		o.Pool = "pve-inspect"
	}
	if o.StateDir == "" {
		o.StateDir = "/var/lib/pve-inspectd/sandboxapi"
	}
	def(&o.ReaperInterval, 30*time.Second)
	if o.ReapParallel <= 0 {
		o.ReapParallel = 4
	}
	def(&o.AgentTimeout, 5*time.Minute)
	def(&o.CreateTimeout, 10*time.Minute)
	def(&o.TeardownTimeout, 5*time.Minute)
	def(&o.ApplyTimeout, 30*time.Minute)
	def(&o.PoolInterval, 10*time.Second)
	shapes, err := ValidateShapes(o.WarmPool)
	if err != nil {
		return err
	}
	for _, s := range shapes {
		if s.Kind == apitype.KindLXC && (o.Containers == nil || o.CTGuests == nil) {
			return fmt.Errorf("sandbox: pool shape %q: kind lxc, but this node makes no containers ([api] containers is off)", s.Name)
		}
	}
	o.WarmPool = shapes
	if o.DiskThreshold <= 0 {
		o.DiskThreshold = DefaultDiskThreshold
	}
	if !o.AutoCIDRPool.IsValid() {
		o.AutoCIDRPool = netip.MustParsePrefix("10.200.0.0/16")
	}
	if o.AutoCIDRBits == 0 {
		o.AutoCIDRBits = 24
	}
	if o.AutoCIDRBits < o.AutoCIDRPool.Bits() || o.AutoCIDRBits > 28 || !o.AutoCIDRPool.Addr().Is4() {
		return fmt.Errorf("sandbox: auto CIDR /%d does not fit pool %s", o.AutoCIDRBits, o.AutoCIDRPool)
	}
	if !PrivateV4(o.AutoCIDRPool) {
		return fmt.Errorf("sandbox: auto CIDR pool %s is not inside a private (RFC 1918) range", o.AutoCIDRPool)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Logger = o.Logger.With("component", "sandbox")
	o.Health.defaults(o.Proxmox)
	return nil
}

// Engine owns the sandboxes of this node: create, delete, the operations
// on their VMs, the reaper, reconcile and the state file.
//
// Lock order, in words: stateMu and zonesMu are each taken before mu and
// never while mu is held (saveState and publishZones read the sandboxes
// under mu inside their own lock, then release mu before they write the
// file or call the hook); idMu, sdnMu, starts and subnetCache's are leaves, taken alone (but
// cacheDrops after starts by the start of a VM with a fixed address); no two
// of stateMu, zonesMu, idMu and sdnMu are ever held together. mu is never
// held across a call to Proxmox, a guest, a hook or the disk; idMu and
// zonesMu are held across the one outside call each serializes (NextID,
// ZonesChanged), stateMu across the state file's write; sdnMu only guards
// the next SDN batch and is never held across ApplySDN (sdnRun, a
// one-slot semaphore, is: zones.go).
type Engine struct {
	o   Options
	log *slog.Logger
	met *metrics
	// health and events are the health monitor and the event buffer, each
	// with a leaf mutex of its own (health.go, events.go); hmet their
	// metrics.
	health *healthMonitor
	events *eventBus
	hmet   *healthMetrics
	// egressEv is what the egress events sent (egressevents.go), with a
	// mutex of its own, never held with mu.
	egressEv *egressEvents

	// The parts of the Proxmox API each step uses (all of them o.Proxmox).
	cloner  cloner
	vms     vmControl
	snaps   snapshotter
	zones   zoneBuilder
	cleaner zoneCleaner
	subnets subnetLister
	pools   pools
	tagger  vmTagger
	addrs   addresser
	fixer   addressFixer

	// The mutex protects the following elements: the map sbx and, in every
	// record, the fields a create, delete, extend or operation changes after
	// the record is in the map (State, Error, ExpiresAt, VMs[i].VMID,
	// deleted, opsCtx, opsCancel, and ops.Add). Held only for memory work.
	mu  sync.Mutex
	sbx map[string]*record
	// members are the warm pool's sandboxes (pool.go), by id, also under
	// mu: never in sbx, so no API call reaches one; a claim moves a record
	// from members to sbx under mu.
	members map[string]*record
	// pool is the warm pool's configuration, wake-up channel and metrics
	// (pool.go); its fields are set in New and never change, but its
	// errs map, which mu guards.
	pool *warmPool

	// idMu protects reserved, the VM ids handed out but not yet cloned, and
	// is held across the NextID call so two clones never pick the same id.
	idMu     sync.Mutex
	reserved map[int]bool

	// ctClones holds a *sync.Mutex per container template id: one clone
	// of a template at a time (member.go cloneCT). A leaf, held across
	// the clone's Proxmox calls and nothing else.
	ctClones sync.Map

	// sdnMu guards sdnNext, the batch of callers waiting for the next
	// ApplySDN; sdnRun (capacity 1) is held by the caller running one:
	// Proxmox applies the whole cluster's pending SDN changes at once, so
	// two applies must not overlap, and callers that arrive while one runs
	// share the next (zones.go).
	sdnMu   sync.Mutex
	sdnNext *sdnBatch
	sdnRun  chan struct{}
	// lastApply is how long the engine's last own SDN apply took
	// (nanoseconds): how long a shared apply's reload is waited for.
	lastApply atomic.Int64
	// starts keeps this engine's VM starts out of its own SDN applies: an
	// apply stops the node's dnsmasqs, and a start's pve-bridge hook fails
	// while they are stopped. An apply holds all of it (allStarts) across
	// its PUT /cluster/sdn task, a start one unit across its start. A
	// start's or an apply's wait for it ends with its context; a leaf,
	// taken alone.
	starts *semaphore.Weighted
	// cacheDrops keeps the releases of the DHCP-range addresses the
	// configures gave NICs of a fixed address (dropRangeAddresses, which
	// holds all of it, cacheDropsAll) out of the starts of VMs with a
	// fixed address (one unit each, across the start): such a start's
	// pve-bridge hook misses Proxmox's MAC cache and rewrites the whole
	// cache unlocked (fixed.go), which would put back a cached address
	// such a release dropped meanwhile. Taken after starts by such a
	// start, alone otherwise; a wait for it ends with its context.
	cacheDrops *semaphore.Weighted
	// stateMu serializes writes of the state file, so the file never goes
	// back to an older list than one already written; taken before mu.
	stateMu sync.Mutex
	// subnetCache is the cluster's subnets as last read (subnetview.go),
	// with a leaf mutex of its own.
	subnetCache *subnetCache
	// zonesMu serializes ZonesChanged calls, so the host guard receives the
	// zone sets in the order they were read; taken before mu.
	zonesMu sync.Mutex
	// busy keeps a VM's disk transfers and snapshot operations apart
	// (disktransfer.go); its own mutex, never held with another.
	busy vmBusy
}

// New builds an Engine. Call Reconcile before the first create and run
// RunReaper.
func New(o Options) (*Engine, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	met, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, fmt.Errorf("sandbox: register metrics: %w", err)
	}
	hm := newHealthMonitor(o.Health)
	hmet, err := newHealthMetrics(o.Registerer, hm)
	if err != nil {
		return nil, fmt.Errorf("sandbox: register health metrics: %w", err)
	}
	px := o.Proxmox
	wp, err := newWarmPool(o.WarmPool, o.Registerer)
	if err != nil {
		return nil, fmt.Errorf("sandbox: register pool metrics: %w", err)
	}
	return &Engine{o: o, log: o.Logger, met: met, sbx: map[string]*record{}, members: map[string]*record{}, pool: wp,
		reserved: map[int]bool{}, sdnRun: make(chan struct{}, 1), starts: semaphore.NewWeighted(allStarts),
		cacheDrops: semaphore.NewWeighted(cacheDropsAll), health: hm, events: newEventBus(o.Health.EventBuffer), hmet: hmet, subnetCache: newSubnetCache(),
		egressEv: &egressEvents{sent: map[string]egressSent{}},
		cloner:   px, vms: px, snaps: px, zones: px, cleaner: px, subnets: px, pools: px, tagger: px, addrs: px, fixer: px}, nil
}

// Options returns the engine's options with the defaults filled in.
func (m *Engine) Options() Options { return m.o }

// Node returns this node's id.
func (m *Engine) Node() string { return m.o.Node }

// record is a sandbox as the engine tracks it (and persists it). Once it
// is in Engine.sbx, its fields are read and written under Engine.mu; the
// channels and cancel are set before and never change.
type record struct {
	apitype.Sandbox
	// created is closed when a create finishes (success or teardown).
	created chan struct{}
	// deleted is closed when a delete finishes.
	deleted chan struct{}
	cancel  context.CancelFunc
	// egress is the policy asked for at create (nil: open); afterwards
	// the Egress part owns the sandbox's policy.
	egress *apitype.EgressPolicy
	// autoCIDR tells, per network, whether its range was picked
	// ("auto"); only such a range is picked again when another node's
	// sandbox took it first (claimSubnet).
	autoCIDR []bool
	// vnetRenames counts the vnets given a new name with a new range
	// (renameVNet), under Engine.mu; a restart tears a record still
	// being created down, so it is not persisted.
	vnetRenames int
	// ops counts the guest and VM operations in flight (exec, files,
	// snapshots, check); opsCancel cancels them. Both are guarded by
	// Engine.mu for Add and cancel: a delete sets StateDeleting and
	// cancels under the lock, so no operation begins after it, then waits
	// for ops before it stops any VM (VM ids are reused: a stale exec must
	// not reach the next sandbox's VM).
	ops       sync.WaitGroup
	opsCtx    context.Context
	opsCancel context.CancelCauseFunc
	// member is set while the record is a warm pool member (pool.go),
	// under Engine.mu; a claim clears it.
	member *memberInfo
	// gone is why the sandbox is being deleted (expired, deleted by whom),
	// set under Engine.mu as it turns to deleting: the calls the delete
	// ends or refuses say it. Not persisted: a delete resumed after a
	// restart says no why.
	gone *goneWhy
}

// List returns a copy of the public view of every sandbox, by id.
func (m *Engine) List() []apitype.Sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]apitype.Sandbox, 0, len(m.sbx))
	for _, r := range m.sbx {
		c := cloneSandbox(r.Sandbox)
		c.Health = m.healthOf(r.ID)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b apitype.Sandbox) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// cloneSandbox copies s deep enough that the copy shares no slice or map.
func cloneSandbox(s apitype.Sandbox) apitype.Sandbox {
	c := s
	c.Networks = slices.Clone(s.Networks)
	c.VMs = make([]apitype.VM, len(s.VMs))
	for i, v := range s.VMs {
		v.Networks = slices.Clone(v.Networks)
		v.NICs = slices.Clone(v.NICs)
		v.Addresses = slices.Clone(v.Addresses)
		c.VMs[i] = v
	}
	if s.Labels != nil {
		c.Labels = make(map[string]string, len(s.Labels))
		for k, v := range s.Labels {
			c.Labels[k] = v
		}
	}
	return c
}

// Get returns a copy of the public view of sandbox id.
func (m *Engine) Get(id string) (apitype.Sandbox, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.sbx[id]
	if !ok {
		return apitype.Sandbox{}, false
	}
	c := cloneSandbox(r.Sandbox)
	c.Health = m.healthOf(id)
	return c, true
}

// updateGaugesLocked recomputes the by-state gauges; call with m.mu held.
func (m *Engine) updateGaugesLocked() {
	sb := map[string]int{}
	vms := map[string]int{}
	for _, r := range m.sbx {
		sb[r.State]++
		vms[r.State] += len(r.VMs)
	}
	for _, s := range []string{apitype.StateCreating, apitype.StateReady, apitype.StateDeleting, apitype.StateError} {
		m.met.sandboxes.WithLabelValues(s).Set(float64(sb[s]))
		m.met.vms.WithLabelValues(s).Set(float64(vms[s]))
	}
}

// setState sets a sandbox's state and error and saves the state file.
func (m *Engine) setState(id, state, msg string) {
	m.mu.Lock()
	if r, ok := m.sbx[id]; ok {
		r.State = state
		r.Error = msg
	}
	m.updateGaugesLocked()
	m.mu.Unlock()
	if err := m.saveState(); err != nil {
		m.log.Error("save state", "err", err)
	}
}

// forget drops a sandbox from the table, with its health track (its
// health, series and event state), and saves the state file.
func (m *Engine) forget(id string) {
	m.mu.Lock()
	delete(m.sbx, id)
	m.dropTrackLocked(id)
	m.updateGaugesLocked()
	m.mu.Unlock()
	if err := m.saveState(); err != nil {
		m.log.Error("save state", "err", err)
	}
}
