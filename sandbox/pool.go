package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// The warm pool: whole sandboxes built ahead of demand, one set per shape,
// so that a create whose request matches a shape answers in the time of a
// claim (no clone, no boot, no SDN apply) instead of a build.
//
// Design decisions:
//
//   - A member is a sandbox in every respect but its owner: its own zone
//     and vnets applied, its VM cloned, hardened, started and answering
//     its agent (or, for a shape of kind lxc, its container cloned from a
//     container template, checked by ctUnsafe, started and entered by the
//     daemon), egress policy "none", its zone handed to the host guard
//     like any other. Both kinds are built by the cold create's own code
//     (buildVM) from the shape's request. Members live in Engine.members,
//     never in Engine.sbx, so no API call (get, exec, files, delete,
//     extend) can reach one: nothing of a tenant runs in a member before
//     its claim, and the only guest calls it has seen are the daemon's
//     own pings (charged to PoolOwner).
//   - A claim moves one ready member from members to sbx under Engine.mu
//     (so two claims never get the same member) and writes the state file
//     before anything else: a restart then finds a sandbox being created
//     (torn down, never handed out again) or a member (never claimed).
//     Only then does it put the request's egress policy in force (as a
//     new instance of the sandbox's egress record, EgressClaimer: what the
//     member's guest was denied or learned is not the claimer's), tag the
//     VM with the sandbox's tags and name (a container: its tags and
//     hostname, retag), write the secrets file, and give the guest its
//     new name (hostname, /etc/hosts: names.go).
//   - A member is used once. A claimed sandbox is deleted like any other;
//     nothing goes back to the pool.
//   - Tenants never meet through a member. Its record (and with it the
//     health track, events and egress record keyed by the sandbox id) is
//     the claimer's from the claim on, its egress record a new instance;
//     what the engine keeps per VM id (kindOf, the health monitor's
//     holds, the disk and snapshot busy marks) is read from the live
//     records or held only for a call, never cached past the member; a
//     deleted member's id is free for the next clone only once its VM or
//     container is destroyed, and a container's exec cgroups are swept
//     before that (deleteVM), so a member that gets the id of another
//     tenant's deleted container starts from its template's disk, a
//     cgroup of its own and nothing else.
//   - Members count against the node caps; a cold create that does not
//     fit makes room by retiring members (they give way first). Refills
//     never go past the caps: the pool waits.
//   - A refill builds the missing members of every shape as one batch:
//     every zone is written, then one SDN apply for all, then the VMs in
//     parallel. Retired members go in parallel too, so their deletes share
//     applies (zones.go coalesces them).
//   - Members older than the shape's maximum age, whose template now
//     resolves to another VM (or container template), or found broken (VM
//     or container not running, agent not answering or the container not
//     entered: the simple check; sandbox health is its own part) are
//     retired and replaced.
//   - Proxmox tags: a member's VMs carry the pool tag "pvei-pool" beside
//     the node and sandbox tags; a claim replaces them with the sandbox's.
//     Reconcile re-adopts a member only when the state file says it is one
//     and its VMs still carry all three tags, are of the kind recorded,
//     and run.

// poolTag marks a warm pool member's VMs in Proxmox.
const poolTag = "pvei-pool"

// memberInfo is what makes a record a warm pool member.
type memberInfo struct {
	shape string
	// template is the template VM id the member was cloned from.
	template int
	// yielding: the member gives way to a cold create; it no longer counts
	// against the caps and is never claimed.
	yielding bool
}

// warmPool is the pool's configuration, wake-up and metrics; set in New
// and never changed, but errs.
type warmPool struct {
	shapes []PoolShape
	// kick wakes RunPool to refill (capacity 1: wake-ups coalesce).
	kick chan struct{}
	// errs is, per shape name, why the last refill could not build it
	// (its template unknown, of the other kind, or failing its checks);
	// guarded by Engine.mu.
	errs map[string]string

	info    *prometheus.GaugeVec
	members *prometheus.GaugeVec
	claims  *prometheus.CounterVec
	refill  *prometheus.HistogramVec
	retired *prometheus.CounterVec
}

func newWarmPool(shapes []PoolShape, reg prometheus.Registerer) (*warmPool, error) {
	p := &warmPool{shapes: shapes, kick: make(chan struct{}, 1), errs: map[string]string{},
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "pve_inspect", Subsystem: "pool", Name: "shape_info",
			Help: "Warm pool shapes, 1 each, with the kind of their members (vm, lxc) and their template.",
		}, []string{"shape", "kind", "template"}),
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "pve_inspect", Subsystem: "pool", Name: "members",
			Help: "Warm pool members by shape and state (ready: claimable; building: being cloned and booted).",
		}, []string{"shape", "state"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pve_inspect", Subsystem: "pool", Name: "claims_total",
			Help: "Creates that asked the warm pool, by shape and result (hit: claimed a member; miss: the shape had none ready; unmatched: no shape, shape empty).",
		}, []string{"shape", "result"}),
		refill: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "pve_inspect", Subsystem: "pool", Name: "refill_seconds",
			Help:    "Time from the start of a refill batch to a member being ready, by shape.",
			Buckets: []float64{1, 2, 4, 8, 15, 30, 60, 120, 300},
		}, []string{"shape"}),
		retired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pve_inspect", Subsystem: "pool", Name: "retired_total",
			Help: "Warm pool members retired unclaimed, by shape and reason (age, template, broken, yield).",
		}, []string{"shape", "reason"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{p.info, p.members, p.claims, p.refill, p.retired} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	for _, s := range shapes {
		p.info.WithLabelValues(s.Name, s.Kind, s.Template).Set(1)
		for _, st := range []string{"ready", "building"} {
			p.members.WithLabelValues(s.Name, st)
		}
		for _, r := range []string{"hit", "miss"} {
			p.claims.WithLabelValues(s.Name, r)
		}
		p.refill.WithLabelValues(s.Name)
	}
	if len(shapes) > 0 {
		p.claims.WithLabelValues("", "unmatched")
	}
	return p, nil
}

// match returns the shape req matches.
func (p *warmPool) match(req apitype.CreateRequest) (PoolShape, bool) {
	for _, s := range p.shapes {
		if s.matches(req) {
			return s, true
		}
	}
	return PoolShape{}, false
}

// shape returns the shape called name.
func (p *warmPool) shape(name string) (PoolShape, bool) {
	i := slices.IndexFunc(p.shapes, func(s PoolShape) bool { return s.Name == name })
	if i < 0 {
		return PoolShape{}, false
	}
	return p.shapes[i], true
}

// wake asks RunPool to refill soon.
func (p *warmPool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// poolGaugesLocked recomputes the members gauge; call with m.mu held.
func (m *Engine) poolGaugesLocked() {
	ready, building := map[string]int{}, map[string]int{}
	for _, r := range m.members {
		switch {
		case r.member.yielding:
		case r.State == apitype.StateReady:
			ready[r.member.shape]++
		case r.State == apitype.StateCreating:
			building[r.member.shape]++
		}
	}
	for _, s := range m.pool.shapes {
		m.pool.members.WithLabelValues(s.Name, "ready").Set(float64(ready[s.Name]))
		m.pool.members.WithLabelValues(s.Name, "building").Set(float64(building[s.Name]))
	}
}

// newIDLocked returns a sandbox id no sandbox or member has; call with
// m.mu held.
func (m *Engine) newIDLocked() string {
	id := newSandboxID()
	for m.sbx[id] != nil || m.members[id] != nil {
		id = newSandboxID()
	}
	return id
}

// vmTags are the Proxmox tags of rec's VMs: the ownership tags, and the
// pool tag while rec is a member.
func (m *Engine) vmTags(rec *record) []string {
	tags := []string{nodeTag(m.o.Node), sandboxTag(rec.ID)}
	m.mu.Lock()
	defer m.mu.Unlock()
	if rec.member != nil {
		tags = append(tags, poolTag)
	}
	return tags
}

// makeRoomLocked checks the caps for a cold create of req and, when only
// the node caps refuse it, picks warm pool members to give way (marked
// yielding; retire them with retireAll once the create is recorded). The
// refusal, when there is no room even so, is the guard's. Call with m.mu
// held.
func (m *Engine) makeRoomLocked(req *apitype.CreateRequest) ([]*record, error) {
	var yield []*record
	for {
		err := m.capsLocked(req, true)
		if err == nil {
			return yield, nil
		}
		var ce *CapError
		if !errors.As(err, &ce) || !strings.HasPrefix(ce.Cap, "node_") {
			break
		}
		v := m.victimLocked()
		if v == nil {
			break
		}
		v.member.yielding = true
		yield = append(yield, v)
	}
	unyieldLocked(yield)
	return nil, m.guardLocked(req)
}

// unyieldLocked undoes makeRoomLocked's choice (the create failed before
// it retired them); call with m.mu held.
func unyieldLocked(yield []*record) {
	for _, r := range yield {
		r.member.yielding = false
	}
}

// victimLocked picks the member that gives way first: one of the shape
// with the most members, the youngest of them (a member still building
// before a ready one). Call with m.mu held.
func (m *Engine) victimLocked() *record {
	count := map[string]int{}
	for _, r := range m.members {
		if !r.member.yielding && r.State != apitype.StateDeleting {
			count[r.member.shape]++
		}
	}
	var best *record
	better := func(a, b *record) bool {
		if count[a.member.shape] != count[b.member.shape] {
			return count[a.member.shape] > count[b.member.shape]
		}
		if (a.State == apitype.StateCreating) != (b.State == apitype.StateCreating) {
			return a.State == apitype.StateCreating
		}
		return a.CreatedAt.After(b.CreatedAt)
	}
	for _, r := range m.members {
		if r.member.yielding || r.State == apitype.StateDeleting {
			continue
		}
		if best == nil || better(r, best) {
			best = r
		}
	}
	return best
}

// claim hands out a ready member of the shape req matches, as a sandbox of
// req. ok is false when req matches no shape, the shape has no member
// ready, or the claimed member failed (it is torn down): the create then
// runs cold. With ok true, err is the guard's refusal of req or nil.
func (m *Engine) claim(ctx context.Context, req apitype.CreateRequest) (sb apitype.Sandbox, ok bool, err error) {
	if len(m.pool.shapes) == 0 {
		return apitype.Sandbox{}, false, nil
	}
	shape, matched := m.pool.match(req)
	if !matched {
		m.pool.claims.WithLabelValues("", "unmatched").Inc()
		return apitype.Sandbox{}, false, nil
	}
	now := m.o.Now()
	m.mu.Lock()
	rec := m.pickMemberLocked(shape.Name)
	if rec == nil {
		m.mu.Unlock()
		m.pool.claims.WithLabelValues(shape.Name, "miss").Inc()
		m.pool.wake()
		return apitype.Sandbox{}, false, nil
	}
	// The member already counts against the node caps; the sandbox it
	// becomes has its size, so only the per-sandbox caps can refuse.
	rec.member.yielding = true
	if err := m.guardLocked(&req); err != nil {
		rec.member.yielding = false
		m.mu.Unlock()
		return apitype.Sandbox{}, true, err
	}
	cctx, cancel := context.WithTimeout(ctx, m.o.CreateTimeout)
	defer cancel()
	delete(m.members, rec.ID)
	rec.member = nil
	rec.State = apitype.StateCreating
	rec.Owner, rec.Labels, rec.FromPool = req.Owner, req.Labels, true
	rec.CreatedAt, rec.ExpiresAt = now, now.Add(time.Duration(req.TTLSeconds)*time.Second)
	rec.VMs[0].Name = orName(req.VMs[0].Name)
	rec.egress = req.Egress
	rec.created, rec.cancel = make(chan struct{}), cancel
	m.sbx[rec.ID] = rec
	m.updateGaugesLocked()
	m.poolGaugesLocked()
	m.mu.Unlock()
	defer close(rec.created)
	m.pool.wake()
	log := m.log.With("sandbox", rec.ID, "shape", shape.Name)
	// The claim is on disk before anything else: a restart from here on
	// finds a sandbox being created, never a member.
	err = m.saveState()
	if err == nil {
		err = m.finishClaim(cctx, rec, req.Env)
	}
	if err != nil {
		log.Warn("claimed pool member failed; tearing it down, the create runs cold", "err", err)
		m.scrap(ctx, rec, err, m.forget)
		m.pool.claims.WithLabelValues(shape.Name, "miss").Inc()
		return apitype.Sandbox{}, false, nil
	}
	m.pool.claims.WithLabelValues(shape.Name, "hit").Inc()
	m.setState(rec.ID, apitype.StateReady, "")
	// to a harness a claim is a create like any other
	m.emitSandbox(apitype.EventCreated, rec, "claimed from the warm pool")
	m.emitSandbox(apitype.EventReady, rec, "")
	log.Info("sandbox ready (claimed from the warm pool)")
	sb, _ = m.Get(rec.ID)
	return sb, true, nil
}

func orName(n string) string {
	if n == "" {
		return "vm0"
	}
	return n
}

// pickMemberLocked returns the oldest ready member of shape; call with
// m.mu held.
func (m *Engine) pickMemberLocked(shape string) *record {
	var best *record
	for _, r := range m.members {
		if r.member.shape != shape || r.member.yielding || r.State != apitype.StateReady {
			continue
		}
		if best == nil || r.CreatedAt.Before(best.CreatedAt) || r.CreatedAt.Equal(best.CreatedAt) && r.ID < best.ID {
			best = r
		}
	}
	return best
}

// finishClaim turns a claimed member into the requested sandbox: its
// egress policy in force first, then the VM's tags and name, then a ping
// and the secrets file, then its name in the guest (names.go).
func (m *Engine) finishClaim(ctx context.Context, rec *record, env map[string]string) error {
	if err := m.claimEgress(ctx, rec); err != nil {
		return err
	}
	m.mu.Lock()
	vms := slices.Clone(rec.VMs)
	id, owner := rec.ID, rec.Owner
	m.mu.Unlock()
	ctx = WithOwner(ctx, owner) // the claimant's calls: charged to the new owner
	for _, v := range vms {
		if err := m.retag(ctx, v, m.vmName(id, v.Name), []string{nodeTag(m.o.Node), sandboxTag(id)}); err != nil {
			return err
		}
		if len(env) == 0 {
			pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			err := m.Guest(v.VMID).Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("vm %d: %w", v.VMID, err)
			}
			continue
		}
		if err := m.writeEnv(ctx, v.VMID, env); err != nil {
			return err
		}
	}
	return m.nameGuests(ctx, rec)
}

// scrap tears down a sandbox or member whose create, claim or refill
// failed with cause, then drops it (forget or forgetMember); when the
// teardown fails too it stays, in state error, for the next try.
func (m *Engine) scrap(ctx context.Context, rec *record, cause error, drop func(id string)) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.o.TeardownTimeout)
	defer cancel()
	if err := m.teardown(tctx, rec); err != nil {
		m.log.Error("teardown after a failure", "sandbox", rec.ID, "err", err)
		m.mu.Lock()
		rec.State, rec.Error = apitype.StateError, fmt.Sprintf("%v; teardown failed: %v", cause, err)
		m.updateGaugesLocked()
		m.poolGaugesLocked()
		m.mu.Unlock()
		if err := m.saveState(); err != nil {
			m.log.Error("save state", "err", err)
		}
		return
	}
	drop(rec.ID)
	m.removeEgress(tctx, rec.ID, rec.Zone)
	if err := m.publishZones(tctx); err != nil {
		m.log.Error("publish zones after teardown", "err", err)
	}
}

// forgetMember drops a member from the pool and saves the state file.
func (m *Engine) forgetMember(id string) {
	m.mu.Lock()
	delete(m.members, id)
	m.poolGaugesLocked()
	m.mu.Unlock()
	if err := m.saveState(); err != nil {
		m.log.Error("save state", "err", err)
	}
}

// Pool returns the warm pool's shapes with their counts and every member.
func (m *Engine) Pool() apitype.PoolStatus {
	now := m.o.Now()
	st := apitype.PoolStatus{Shapes: []apitype.PoolShapeStatus{}, Members: []apitype.PoolMember{}}
	m.mu.Lock()
	defer m.mu.Unlock()
	count := map[string]map[string]int{}
	for _, r := range m.members {
		state := r.State
		if r.member.yielding {
			state = "yielding"
		}
		if count[r.member.shape] == nil {
			count[r.member.shape] = map[string]int{}
		}
		count[r.member.shape][state]++
		pm := apitype.PoolMember{ID: r.ID, Shape: r.member.shape, State: state, CreatedAt: r.CreatedAt,
			AgeSeconds: int64(now.Sub(r.CreatedAt) / time.Second), Error: r.Error}
		for _, v := range r.VMs {
			pm.VMIDs = append(pm.VMIDs, v.VMID)
		}
		for _, n := range r.Networks {
			pm.CIDRs = append(pm.CIDRs, n.CIDR)
		}
		st.Members = append(st.Members, pm)
	}
	slices.SortFunc(st.Members, func(a, b apitype.PoolMember) int {
		if c := strings.Compare(a.Shape, b.Shape); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	for _, s := range m.pool.shapes {
		c := count[s.Name]
		st.Shapes = append(st.Shapes, apitype.PoolShapeStatus{Name: s.Name, Kind: s.Kind, Template: s.Template, Cores: s.Cores, MemoryMiB: s.MemoryMiB,
			Networks: slices.Clone(s.Networks), Egress: s.Egress, Target: s.Target, MaxAgeSeconds: int64(s.MaxAge / time.Second),
			Ready: c[apitype.StateReady], Building: c[apitype.StateCreating], Error: m.pool.errs[s.Name]})
	}
	return st
}
