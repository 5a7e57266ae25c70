package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// HealthOptions configure the health monitor (RunHealth). Zero values take
// the documented defaults.
type HealthOptions struct {
	// Interval is how often every ready sandbox's VMs are checked (5s).
	Interval time.Duration
	// PingTimeout bounds one agent ping (3s, what Proxmox's own ping
	// allows).
	PingTimeout time.Duration
	// AgentBrokenAfter: an agent silent for longer is broken
	// (agent-unresponsive); silent for less, degraded (agent-slow) (20s).
	AgentBrokenAfter time.Duration
	// OOMWindow: a VM stays degraded (oom-kill) this long after its cgroup
	// last counted a new OOM kill (5m).
	OOMWindow time.Duration
	// DiskFullPercent: a guest filesystem this full or fuller degrades the
	// VM (guest-disk-full, guest-reported) (95).
	DiskFullPercent float64
	// ExpiringSoon is the warning window of the expiring-soon event (5m).
	ExpiringSoon time.Duration
	// Status reads a VM's Proxmox and QMP status; nil: Options.Proxmox
	// when it implements VMStatusReader, else its VM call (no QMP status).
	Status VMStatusReader
	// Node reads a member's cgroup and tap (a container's: veth) counters
	// on the node; nil: NodeReader{} (the node's /sys).
	Node NodeStats
	// EventBuffer is how many events GET /v1/events can replay (1024).
	EventBuffer int
	// EgressInterval is how often a sandbox's egress event may come, at
	// most (1s; RunEgressEvents).
	EgressInterval time.Duration
}

func (h *HealthOptions) defaults(px Proxmox) {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&h.Interval, 5*time.Second)
	def(&h.PingTimeout, 3*time.Second)
	def(&h.AgentBrokenAfter, 20*time.Second)
	def(&h.OOMWindow, 5*time.Minute)
	def(&h.ExpiringSoon, 5*time.Minute)
	def(&h.EgressInterval, time.Second)
	if h.DiskFullPercent <= 0 || h.DiskFullPercent > 100 {
		h.DiskFullPercent = 95
	}
	if h.EventBuffer <= 0 {
		h.EventBuffer = 1024
	}
	if h.Status == nil {
		if r, ok := px.(VMStatusReader); ok {
			h.Status = r
		} else {
			h.Status = vmInfoStatus{px}
		}
	}
	if h.Node == nil {
		h.Node = NodeReader{}
	}
}

// VMRunState is a VM's run state as Proxmox reports it (GET
// /nodes/{node}/qemu/{vmid}/status/current: status and qmpstatus).
type VMRunState struct {
	Status    string
	QMPStatus string
}

// VMStatusReader reads a VM's run state (pveapi.Client); errors wrap
// ErrNotFound when the VM does not exist.
type VMStatusReader interface {
	VMStatus(ctx context.Context, vmid int) (VMRunState, error)
}

// vmInfoStatus reads the run state through vmControl.VM (no QMP status).
type vmInfoStatus struct{ vms vmControl }

func (v vmInfoStatus) VMStatus(ctx context.Context, vmid int) (VMRunState, error) {
	info, err := v.vms.VM(ctx, vmid)
	if err != nil {
		return VMRunState{}, err
	}
	return VMRunState{Status: info.Status}, nil
}

// NodeStats reads a sandbox member's resources on the node. Sources that
// cannot be read are named in VMStats.Missing ("cgroup", "taps",
// "veths").
type NodeStats interface {
	// VMStats reads VM vmid's: its cgroup (qemu.slice/<vmid>.scope) and
	// its tap devices (tap<vmid>i<n>, n below nics).
	VMStats(vmid, nics int) VMStats
	// CTStats reads container vmid's: its cgroup (lxc/<vmid>, the
	// container's ns below it) and its veths (veth<vmid>i<n>, n below
	// nics).
	CTStats(vmid, nics int) VMStats
}

// VMStats are a member's counters read on the node (a VM's or a
// container's).
type VMStats struct {
	CPUSeconds                             float64
	MemoryBytes, MemoryPeakBytes           uint64
	OOMKills                               uint64
	DiskReadBytes, DiskWriteBytes          uint64
	NetBytesToGuest, NetBytesFromGuest     uint64
	NetPacketsToGuest, NetPacketsFromGuest uint64
	Missing                                []string
}

// FilesystemReporter is the optional part of a Guest that reports the
// guest's filesystems (qga.Guest: guest-get-fsinfo). What it returns is
// guest-reported.
type FilesystemReporter interface {
	Filesystems(ctx context.Context) ([]apitype.GuestFilesystem, error)
}

// BrokenError refuses an exec or file call on a broken VM (problem type
// sandbox-broken): the call was not tried.
type BrokenError struct {
	Sandbox, VM string
	Reason      string
	Detail      string
}

func (e *BrokenError) Error() string {
	return fmt.Sprintf("sandbox %s vm %s is broken (%s): %s", e.Sandbox, e.VM, e.Reason, e.Detail)
}

// vmTrack is what the monitor keeps of one VM between checks.
type vmTrack struct {
	h apitype.VMHealth
	// lastAnswer is when the agent last answered (the track's start
	// before the first answer).
	lastAnswer time.Time
	// lastBusy is when a ping was last refused by the daemon's own
	// budget (ErrBusy, ErrOwnerBusy): the agent's silence is counted from
	// the later of the two, so a node busy with other guests' replies
	// never turns a sandbox broken.
	lastBusy time.Time
	// oomBase is the cgroup's OOM kill count when the track began;
	// lastOOM when a new kill was last seen, oomSeen the count then.
	oomBase, oomSeen uint64
	oomBaseSet       bool
	lastOOM          time.Time
}

// sbTrack is what the monitor keeps of one sandbox.
type sbTrack struct {
	owner string
	h     apitype.SandboxHealth
	vms   map[string]*vmTrack
	// warned is the expiry an expiring-soon event was sent for.
	warned time.Time
	// denials is the time of the newest egress denial already sent.
	denials time.Time
}

// healthMonitor holds the health of every ready sandbox. Its mutex mu is
// a leaf: taken alone or while Engine.mu is held, never the other way
// round, and never across a call to Proxmox, a guest or the node.
type healthMonitor struct {
	o HealthOptions

	// roundMu serializes health rounds (CheckHealth), so two rounds never
	// judge the same VM at once or send one change twice; taken first,
	// before m.mu and mu, and held across the round's outside calls.
	roundMu sync.Mutex

	// The mutex protects the following elements: sb and, in every track,
	// every field.
	mu sync.Mutex
	sb map[string]*sbTrack
	// held counts the VMs a rollback is restarting: their checks are
	// skipped (a rollback stops and starts the VM on purpose).
	held map[int]int
}

func newHealthMonitor(o HealthOptions) *healthMonitor {
	return &healthMonitor{o: o, sb: map[string]*sbTrack{}, held: map[int]int{}}
}

// holdHealth skips the checks of VM vmid until the returned func is
// called (a rollback restarts the VM).
func (m *Engine) holdHealth(vmid int) func() {
	hm := m.health
	hm.mu.Lock()
	hm.held[vmid]++
	hm.mu.Unlock()
	return func() {
		now := m.o.Now()
		hm.mu.Lock()
		if hm.held[vmid]--; hm.held[vmid] <= 0 {
			delete(hm.held, vmid)
		}
		// The agent was away on purpose: its silence counts from now.
		for _, t := range hm.sb {
			for _, v := range t.vms {
				if v.h.VMID == vmid {
					v.lastAnswer = now
				}
			}
		}
		hm.mu.Unlock()
	}
}

// healthOf returns a copy of sandbox id's health (nil before its first
// check); call with m.mu held or not (the monitor's mutex is a leaf).
func (m *Engine) healthOf(id string) *apitype.SandboxHealth {
	hm := m.health
	hm.mu.Lock()
	defer hm.mu.Unlock()
	t, ok := hm.sb[id]
	if !ok || t.h.State == "" {
		return nil
	}
	h := t.h
	h.VMs = slices.Clone(t.h.VMs)
	for i := range h.VMs {
		h.VMs[i].Host.Missing = slices.Clone(h.VMs[i].Host.Missing)
	}
	return &h
}

// Health returns sandbox id's health (false before its first check or for
// an unknown sandbox).
func (m *Engine) Health(id string) (apitype.SandboxHealth, bool) {
	h := m.healthOf(id)
	if h == nil {
		return apitype.SandboxHealth{}, false
	}
	return *h, true
}

// Broken returns a BrokenError when VM vm of sandbox id (the first when vm
// is empty) is broken, nil otherwise: exec and file calls check it before
// they begin, so they fail at once instead of waiting out a timeout.
func (m *Engine) Broken(id, vm string) error {
	hm := m.health
	hm.mu.Lock()
	defer hm.mu.Unlock()
	t, ok := hm.sb[id]
	if !ok {
		return nil
	}
	for _, v := range t.h.VMs {
		if v.Name == vm || vm == "" {
			if v.State == apitype.HealthBroken {
				return &BrokenError{Sandbox: id, VM: v.Name, Reason: v.Reason, Detail: v.Detail}
			}
			return nil
		}
	}
	return nil
}

// RunHealth checks every ready sandbox's VMs every Interval until ctx
// ends (the owner is the daemon's API part, beside RunReaper).
func (m *Engine) RunHealth(ctx context.Context) {
	t := time.NewTicker(m.health.o.Interval)
	defer t.Stop()
	for {
		m.CheckHealth(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sbView is a ready sandbox as one health round sees it.
type sbView struct {
	id, owner, zone string
	expires         time.Time
	vms             []apitype.VM
	// rec is the sandbox's record: the instance. A track is made only
	// while m.sbx still holds this very record (checkSandbox), so a round
	// that overlaps a delete never brings a dropped track back.
	rec *record
}

// CheckHealth checks every ready sandbox's VMs once, updates their
// health, sends the events and drops the tracks of sandboxes that are no
// longer ready.
func (m *Engine) CheckHealth(ctx context.Context) {
	m.health.roundMu.Lock()
	defer m.health.roundMu.Unlock()
	m.mu.Lock()
	var views []sbView
	for id, r := range m.sbx {
		if r.State == apitype.StateReady {
			views = append(views, sbView{id: id, owner: r.Owner, zone: r.Zone, expires: r.ExpiresAt, vms: slices.Clone(r.VMs), rec: r})
		}
	}
	m.mu.Unlock()
	m.dropTracks(views)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, v := range views {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			m.checkSandbox(ctx, v)
		}()
	}
	wg.Wait()
}

// dropTrackLocked forgets sandbox id's track (its health, its series and
// the state of its events) at once; call with m.mu held, in the same
// critical section that removes the record from m.sbx.
func (m *Engine) dropTrackLocked(id string) {
	hm := m.health
	hm.mu.Lock()
	delete(hm.sb, id)
	hm.mu.Unlock()
}

// dropTracks forgets the tracks of sandboxes not in views.
func (m *Engine) dropTracks(views []sbView) {
	keep := map[string]bool{}
	for _, v := range views {
		keep[v.id] = true
	}
	hm := m.health
	hm.mu.Lock()
	for id := range hm.sb {
		if !keep[id] {
			delete(hm.sb, id)
		}
	}
	hm.mu.Unlock()
}

// checkSandbox checks one sandbox's VMs and folds them into its health.
func (m *Engine) checkSandbox(ctx context.Context, v sbView) {
	hm := m.health
	now := m.o.Now()
	m.mu.Lock() // Engine.mu before the monitor's leaf mutex
	if m.sbx[v.id] != v.rec {
		m.mu.Unlock()
		return // deleted since the round began: its track is gone for good
	}
	hm.mu.Lock()
	t, ok := hm.sb[v.id]
	if !ok {
		t = &sbTrack{owner: v.owner, vms: map[string]*vmTrack{}, denials: now}
		hm.sb[v.id] = t
	}
	for _, vm := range v.vms {
		if t.vms[vm.Name] == nil {
			t.vms[vm.Name] = &vmTrack{lastAnswer: now, h: apitype.VMHealth{Name: vm.Name, VMID: vm.VMID}}
		}
	}
	hm.mu.Unlock()
	m.mu.Unlock()

	results := make([]vmCheck, len(v.vms))
	var wg sync.WaitGroup
	// the monitor's calls into the guests are charged to the sandbox's
	// owner (the guest agent client's share rule, qga.Budget)
	octx := WithOwner(ctx, v.owner)
	for i, vm := range v.vms {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = m.checkVM(octx, vm) }()
	}
	wg.Wait()
	hm.mu.Lock()
	current := hm.sb[v.id] == t
	hm.mu.Unlock()
	if ctx.Err() != nil || !current {
		return // ended, or the sandbox was deleted during the checks
	}
	now = m.o.Now()
	changed, h := m.fold(v, t, results, now)
	if changed {
		m.hmet.changes.WithLabelValues(h.State, h.Reason).Inc()
		m.emit(apitype.Event{Type: apitype.EventHealth, Sandbox: v.id, Owner: v.owner, Health: &h})
		m.log.Info("sandbox health changed", "sandbox", v.id, "state", h.State, "reason", h.Reason, "detail", h.Detail)
	}
	m.expiryEvents(v, t, now)
	m.egressEvents(v, t)
}

// vmCheck is one VM's signals from one round.
type vmCheck struct {
	name    string
	vmid    int
	skipped bool
	// noAgent: the VM has no guest agent (agent false): not pinged, and
	// no agent signal is judged.
	noAgent bool
	run     VMRunState
	runErr  error
	ping    error
	busy    bool // ping refused by the daemon's budget, not the guest's doing
	rtt     time.Duration
	stats   VMStats
	fs      []apitype.GuestFilesystem
	fsErr   error
	fsAsked bool
}

// checkVM reads one member's signals: Proxmox and QMP status, the agent's
// ping (a container's: the daemon enters it; none for a VM without an
// agent), its cgroup and taps (a container's veths), and what the agent
// reports of the guest.
func (m *Engine) checkVM(ctx context.Context, vm apitype.VM) vmCheck {
	c := vmCheck{name: vm.Name, vmid: vm.VMID, noAgent: !vm.HasAgent()}
	hm := m.health
	hm.mu.Lock()
	c.skipped = hm.held[vm.VMID] > 0
	hm.mu.Unlock()
	if c.skipped || vm.VMID == 0 {
		c.skipped = true
		return c
	}
	sctx, cancel := context.WithTimeout(ctx, hm.o.PingTimeout*2)
	if vm.Kind == apitype.KindLXC {
		c.run, c.runErr = m.ctStatus(sctx, vm.VMID)
	} else {
		c.run, c.runErr = hm.o.Status.VMStatus(sctx, vm.VMID)
	}
	cancel()
	if vm.Kind == apitype.KindLXC {
		c.stats = hm.o.Node.CTStats(vm.VMID, portsOf(vm))
	} else {
		c.stats = hm.o.Node.VMStats(vm.VMID, portsOf(vm))
	}
	if c.runErr != nil || c.run.Status != "running" || c.noAgent {
		return c
	}
	g := m.Guest(vm.VMID)
	pctx, cancel := context.WithTimeout(ctx, hm.o.PingTimeout)
	start := time.Now()
	c.ping = g.Ping(pctx)
	c.rtt = time.Since(start)
	cancel()
	if errors.Is(c.ping, ErrBusy) || errors.Is(c.ping, ErrOwnerBusy) {
		c.busy = true
		owner, _ := OwnerOf(ctx)
		m.hmet.busy.WithLabelValues(ownerLabel(owner)).Inc()
	}
	if fr, ok := g.(FilesystemReporter); ok && c.ping == nil {
		fctx, cancel := context.WithTimeout(ctx, hm.o.PingTimeout)
		c.fs, c.fsErr = fr.Filesystems(fctx)
		c.fsAsked = true
		cancel()
	}
	return c
}

// portsOf is how many taps (a container's veths) member vm has on the
// node: none for a member without any NIC (no_network), else one per
// network, at least one.
func portsOf(vm apitype.VM) int {
	if vm.NoNetwork {
		return 0
	}
	return max(len(vm.Networks), 1)
}

// fold turns a round's checks into the VMs' and the sandbox's health; it
// reports whether the sandbox's state or reason changed.
func (m *Engine) fold(v sbView, t *sbTrack, results []vmCheck, now time.Time) (bool, apitype.SandboxHealth) {
	hm := m.health
	hm.mu.Lock()
	defer hm.mu.Unlock()
	worst := apitype.VMHealth{State: apitype.HealthOK}
	vms := make([]apitype.VMHealth, 0, len(results))
	for _, c := range results {
		vt := t.vms[c.name]
		if vt == nil {
			continue
		}
		if !c.skipped {
			state, reason, detail := hm.judge(vt, c, now)
			if state != vt.h.State || reason != vt.h.Reason {
				vt.h.Since = now
			}
			vt.h.State, vt.h.Reason, vt.h.Detail = state, reason, detail
		}
		if vt.h.State == "" {
			vt.h.State, vt.h.Since = apitype.HealthOK, now
		}
		vms = append(vms, vt.h)
		if rank(vt.h.State) > rank(worst.State) {
			worst = vt.h
		}
	}
	prev := t.h
	t.h.VMs = vms
	t.h.CheckedAt = now
	t.h.State, t.h.Reason, t.h.Detail = worst.State, worst.Reason, worst.Detail
	changed := prev.State != t.h.State || prev.Reason != t.h.Reason
	if changed {
		t.h.Since = now
		if t.h.State == apitype.HealthBroken {
			m.hmet.breaks.WithLabelValues(t.h.Reason).Inc()
		}
	}
	h := t.h
	h.VMs = slices.Clone(vms)
	// The first verdict of a sandbox is news only when it is not ok.
	return changed && (prev.State != "" || t.h.State != apitype.HealthOK), h
}

// rank orders the health states from best to worst.
func rank(state string) int {
	switch state {
	case apitype.HealthBroken:
		return 2
	case apitype.HealthDegraded:
		return 1
	}
	return 0
}

// judge records c's signals in vt.h.Host and GuestReported and returns
// the VM's state, reason and detail. Host-side signals decide first; the
// guest's own report can degrade a VM, never break it. A VM without an
// agent was not pinged (c.ping nil, c.busy false): it is judged by
// Proxmox, QMP and its cgroup alone, and its missing agent is never a
// reason. Call with hm.mu held.
func (hm *healthMonitor) judge(vt *vmTrack, c vmCheck, now time.Time) (string, string, string) {
	host := &vt.h.Host
	st := c.stats
	*host = apitype.HostSignals{Status: c.run.Status, QMPStatus: c.run.QMPStatus,
		CPUSeconds: st.CPUSeconds, MemoryBytes: st.MemoryBytes, MemoryPeakBytes: st.MemoryPeakBytes, OOMKills: st.OOMKills,
		DiskReadBytes: st.DiskReadBytes, DiskWriteBytes: st.DiskWriteBytes,
		NetBytesToGuest: st.NetBytesToGuest, NetBytesFromGuest: st.NetBytesFromGuest, NetPacketsToGuest: st.NetPacketsToGuest, NetPacketsFromGuest: st.NetPacketsFromGuest,
		Missing: slices.Clone(st.Missing)}
	if c.runErr != nil && !errors.Is(c.runErr, ErrNotFound) {
		host.Missing = append(host.Missing, "proxmox")
	}
	host.NoAgent = c.noAgent
	if c.ping == nil && c.runErr == nil && c.run.Status == "running" && !c.noAgent {
		vt.lastAnswer = now
		host.AgentOK = true
		host.AgentRTTSeconds = c.rtt.Seconds()
	}
	if !c.noAgent {
		la := vt.lastAnswer
		host.LastAgentAnswer = &la
		host.SecondsSinceAgentAnswer = now.Sub(vt.lastAnswer).Seconds()
	}
	if c.busy {
		vt.lastBusy = now
	}
	// silence: since the agent answered, or the daemon last could not ask
	silent := now.Sub(vt.lastAnswer)
	if vt.lastBusy.After(vt.lastAnswer) {
		silent = now.Sub(vt.lastBusy)
	}
	if !vt.oomBaseSet && !slices.Contains(st.Missing, "cgroup") {
		vt.oomBase, vt.oomSeen, vt.oomBaseSet = st.OOMKills, st.OOMKills, true
	}
	if vt.oomBaseSet && st.OOMKills > vt.oomSeen {
		vt.oomSeen, vt.lastOOM = st.OOMKills, now
	}
	vt.h.GuestReported = nil
	if c.fsAsked {
		gr := &apitype.GuestReport{Filesystems: c.fs}
		if c.fsErr != nil {
			gr.Error = c.fsErr.Error()
		}
		vt.h.GuestReported = gr
	}
	switch {
	case errors.Is(c.runErr, ErrNotFound):
		return apitype.HealthBroken, apitype.ReasonVMMissing, fmt.Sprintf("vm %s (%d) no longer exists in Proxmox", c.name, c.vmid)
	case c.runErr != nil:
		// Proxmox did not answer: keep the last verdict rather than guess.
		if vt.h.State != "" {
			return vt.h.State, vt.h.Reason, vt.h.Detail
		}
		return apitype.HealthOK, "", ""
	case c.run.Status != "running":
		return apitype.HealthBroken, apitype.ReasonVMStopped, fmt.Sprintf("vm %s (%d) is %s in Proxmox", c.name, c.vmid, c.run.Status)
	case c.run.QMPStatus == "guest-panicked":
		return apitype.HealthBroken, apitype.ReasonGuestPanicked, fmt.Sprintf("vm %s (%d): the guest kernel panicked (QMP status guest-panicked)", c.name, c.vmid)
	case c.run.QMPStatus == "internal-error":
		return apitype.HealthBroken, apitype.ReasonInternalError, fmt.Sprintf("vm %s (%d): QEMU stopped the guest (QMP status internal-error)", c.name, c.vmid)
	case c.run.QMPStatus != "" && c.run.QMPStatus != "running":
		return apitype.HealthDegraded, apitype.ReasonVMPaused, fmt.Sprintf("vm %s (%d): QMP status %s", c.name, c.vmid, c.run.QMPStatus)
	case c.busy:
		// the daemon's budget refused the ping: no word on the agent this
		// round, keep the last verdict
		if vt.h.State != "" {
			return vt.h.State, vt.h.Reason, vt.h.Detail
		}
		return apitype.HealthOK, "", ""
	case c.ping != nil && silent > hm.o.AgentBrokenAfter:
		return apitype.HealthBroken, apitype.ReasonAgentUnresponsive, fmt.Sprintf("vm %s (%d): the guest agent has not answered for %s (last: %v)", c.name, c.vmid, silent.Round(time.Second), c.ping)
	case vt.oomBaseSet && vt.oomSeen > vt.oomBase && now.Sub(vt.lastOOM) < hm.o.OOMWindow:
		return apitype.HealthDegraded, apitype.ReasonOOMKill, fmt.Sprintf("vm %s (%d): %d OOM kills in its cgroup since the sandbox was checked first, the last %s ago", c.name, c.vmid, vt.oomSeen-vt.oomBase, now.Sub(vt.lastOOM).Round(time.Second))
	case c.ping != nil:
		return apitype.HealthDegraded, apitype.ReasonAgentSlow, fmt.Sprintf("vm %s (%d): the guest agent did not answer for %s (last: %v)", c.name, c.vmid, silent.Round(time.Second), c.ping)
	}
	for _, f := range c.fs {
		if f.TotalBytes > 0 && float64(f.UsedBytes)*100 >= hm.o.DiskFullPercent*float64(f.TotalBytes) {
			return apitype.HealthDegraded, apitype.ReasonGuestDiskFull, fmt.Sprintf("vm %s (%d): the guest reports %s %.0f%% full (guest-reported)", c.name, c.vmid, f.Mountpoint, float64(f.UsedBytes)*100/float64(f.TotalBytes))
		}
	}
	return apitype.HealthOK, "", ""
}
