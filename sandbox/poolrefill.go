package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// RunPool keeps the warm pool at its targets until ctx ends: every
// PoolInterval it checks the members (retiring the old, stale and broken)
// and refills; a claim or a miss wakes it to refill at once. It returns at
// once when no shape is configured. Members stay when it returns: the next
// start re-adopts them.
func (m *Engine) RunPool(ctx context.Context) {
	if len(m.pool.shapes) == 0 {
		return
	}
	t := time.NewTicker(m.o.PoolInterval)
	defer t.Stop()
	check := true
	for {
		if check {
			m.checkMembers(ctx)
		}
		m.refill(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			check = true
		case <-m.pool.kick:
			check = false
		}
	}
}

// MaintainPool checks the members and refills once, returning when the
// refill's members are ready or failed (tests and the bench; RunPool does
// this on its own).
func (m *Engine) MaintainPool(ctx context.Context) {
	m.checkMembers(ctx)
	m.refill(ctx)
}

// checkMembers retires the members past their shape's maximum age, those
// whose template name now resolves to another VM, those found broken (VM
// not running or agent not answering) and those a failed retire left in
// state error.
func (m *Engine) checkMembers(ctx context.Context) {
	now := m.o.Now()
	type cand struct {
		rec   *record
		shape PoolShape
		tmpl  int
		vms   []apitype.VM
		state string
		since time.Time
	}
	var cands []cand
	m.mu.Lock()
	for _, r := range m.members {
		if r.State == apitype.StateCreating || r.State == apitype.StateDeleting || r.member.yielding && r.State != apitype.StateError {
			continue // building, going, or giving way (a failed teardown of one is retried here)
		}
		sh, _ := m.pool.shape(r.member.shape)
		cands = append(cands, cand{rec: r, shape: sh, tmpl: r.member.template, vms: slices.Clone(r.VMs), state: r.State, since: r.CreatedAt})
	}
	m.mu.Unlock()
	current := map[string]int{}
	for _, s := range m.pool.shapes {
		if id, err := m.templateIDOf(ctx, s.memberKind(), s.Template); err == nil {
			current[s.Name] = id
		} else {
			m.log.Warn("pool: look up template", "shape", s.Name, "err", err)
		}
	}
	retire := map[string][]*record{}
	for _, c := range cands {
		reason := ""
		switch {
		case c.state == apitype.StateError || c.shape.Name == "":
			reason = "broken"
		case c.shape.MaxAge > 0 && !now.Before(c.since.Add(c.shape.MaxAge)):
			reason = "age"
		case current[c.shape.Name] != 0 && current[c.shape.Name] != c.tmpl:
			reason = "template"
		case m.memberBroken(ctx, c.vms) != nil:
			reason = "broken"
		}
		if reason != "" {
			retire[reason] = append(retire[reason], c.rec)
		}
	}
	var wg sync.WaitGroup
	for reason, recs := range retire {
		wg.Add(1)
		go func() { defer wg.Done(); m.retireAll(ctx, recs, reason) }()
	}
	wg.Wait()
}

// memberBroken is the simple check of a member: every VM or container
// running in Proxmox (through its kind's API) and its guest answering a
// ping (a VM's agent; for a container, the daemon entering it).
func (m *Engine) memberBroken(ctx context.Context, vms []apitype.VM) error {
	for _, v := range vms {
		id := v.VMID
		px, err := m.opsOf(v.Kind)
		if err != nil {
			return err
		}
		info, err := px.VM(ctx, id)
		if err != nil {
			return fmt.Errorf("vm %d: %w", id, err)
		}
		if info.Status != "running" {
			return fmt.Errorf("vm %d is %s", id, info.Status)
		}
		pctx, cancel := context.WithTimeout(WithOwner(ctx, PoolOwner), 3*time.Second)
		err = m.Guest(id).Ping(pctx)
		cancel()
		if err != nil {
			return fmt.Errorf("vm %d: %w", id, err)
		}
	}
	return nil
}

// retireAll retires members in parallel, so their SDN deletes share
// applies; it returns when all are gone (or failed, left in state error
// for the next check).
func (m *Engine) retireAll(ctx context.Context, recs []*record, reason string) {
	var wg sync.WaitGroup
	for _, r := range recs {
		wg.Add(1)
		go func() { defer wg.Done(); m.retire(ctx, r, reason) }()
	}
	wg.Wait()
}

// retire removes one member. A member still building is cancelled instead:
// its refill tears it down.
func (m *Engine) retire(ctx context.Context, rec *record, reason string) {
	m.mu.Lock()
	if m.members[rec.ID] != rec || rec.State == apitype.StateDeleting {
		m.mu.Unlock()
		return
	}
	shape := rec.member.shape
	if rec.State == apitype.StateCreating {
		cancel := rec.cancel
		m.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		return
	}
	rec.State = apitype.StateDeleting
	m.poolGaugesLocked()
	m.mu.Unlock()
	m.pool.retired.WithLabelValues(shape, reason).Inc()
	m.log.Info("pool: retiring member", "sandbox", rec.ID, "shape", shape, "reason", reason)
	if err := m.saveState(); err != nil {
		m.log.Error("save state", "err", err)
	}
	m.scrap(ctx, rec, fmt.Errorf("retire (%s)", reason), m.forgetMember)
}

// refill builds the members every shape lacks, as far as the caps allow,
// as one batch: every zone written, one SDN apply, one publish, then the
// VMs in parallel. It returns when each is ready or torn down.
func (m *Engine) refill(ctx context.Context) {
	want := m.deficits()
	if len(want) == 0 {
		return
	}
	start := time.Now()
	tmpl := map[string]int{}
	for name := range want {
		sh, _ := m.pool.shape(name)
		id, err := m.shapeTemplate(ctx, sh)
		m.setShapeError(name, err)
		if err != nil {
			delete(want, name)
			continue
		}
		tmpl[name] = id
	}
	foreign, host, err := m.rangesInUse(ctx)
	if err != nil {
		m.log.Error("pool: refill", "err", err)
		return
	}
	batch, ctxs, cancels := m.planMembers(ctx, want, tmpl, foreign, host)
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	if len(batch) == 0 {
		return
	}
	m.log.Info("pool: refilling", "members", len(batch))
	if err := m.saveState(); err != nil {
		m.log.Error("pool: refill", "err", err)
		for _, r := range batch {
			m.forgetMember(r.ID)
		}
		return
	}
	m.buildMembers(ctx, batch, ctxs, tmpl, start)
}

// shapeTemplate resolves the template of shape s by the shape's kind and
// checks it as a cold create of s's request would (the hardened profile
// of a VM template, the container rule of a container template: ctUnsafe).
// A name that is only the other kind's template is refused saying so: a
// shape of kind lxc naming a VM template, or of kind vm naming a
// container template.
func (m *Engine) shapeTemplate(ctx context.Context, s PoolShape) (int, error) {
	kind := s.memberKind()
	id, err := m.templateIDOf(ctx, kind, s.Template)
	var unknown *InvalidError
	if errors.As(err, &unknown) {
		switch {
		case kind == apitype.KindLXC:
			if _, verr := m.templateID(ctx, s.Template); verr == nil {
				return 0, invalid("template", "pool shape %q is of kind lxc, and its template %q is a VM template: give it a container template", s.Name, s.Template)
			}
		case m.o.Containers != nil:
			if _, cerr := m.o.Containers.CTTemplateID(ctx, s.Template); cerr == nil {
				return 0, invalid("template", "pool shape %q is of kind vm, and its template %q is a container template: give the shape kind = \"lxc\"", s.Name, s.Template)
			}
		}
	}
	if err != nil {
		return 0, err
	}
	if kind == apitype.KindLXC {
		err = m.checkCT(ctx, "container template "+s.Template, id)
	} else {
		err = m.checkTemplates(ctx, []string{s.Template}, []int{id}, []templateVM{{Req: apitype.VMRequest{Template: s.Template}}})
	}
	if err != nil {
		return 0, err
	}
	return id, nil
}

// setShapeError records why shape cannot refill (nil: it can), for Pool,
// and logs a new reason once.
func (m *Engine) setShapeError(shape string, err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	m.mu.Lock()
	changed := m.pool.errs[shape] != msg
	if msg == "" {
		delete(m.pool.errs, shape)
	} else {
		m.pool.errs[shape] = msg
	}
	m.mu.Unlock()
	if changed && err != nil {
		m.log.Error("pool: cannot refill shape", "shape", shape, "err", err)
	}
}

// deficits returns, per shape, how many members it lacks.
func (m *Engine) deficits() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	have := map[string]int{}
	for _, r := range m.members {
		if !r.member.yielding && (r.State == apitype.StateReady || r.State == apitype.StateCreating) {
			have[r.member.shape]++
		}
	}
	want := map[string]int{}
	for _, s := range m.pool.shapes {
		if n := s.Target - have[s.Name]; n > 0 {
			want[s.Name] = n
		}
	}
	return want
}

// rangesInUse returns the cluster's subnets and the host's networks (what
// auto ranges must avoid).
func (m *Engine) rangesInUse(ctx context.Context) (foreign, host []netip.Prefix, err error) {
	if foreign, err = m.clusterSubnets(ctx, false); err != nil {
		return nil, nil, err
	}
	if m.o.HostNetworks != nil {
		if host, err = m.o.HostNetworks(ctx); err != nil {
			return nil, nil, fmt.Errorf("host networks: %w", err)
		}
	}
	return foreign, host, nil
}

// planMembers records the new members (state creating) within the caps,
// each with the context of its build (cancelled by rec.cancel: a member
// that gives way while it builds).
func (m *Engine) planMembers(ctx context.Context, want map[string]int, tmpl map[string]int, foreign, host []netip.Prefix) ([]*record, []context.Context, []context.CancelFunc) {
	now := m.o.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	var batch []*record
	var ctxs []context.Context
	var cancels []context.CancelFunc
	for _, sh := range m.pool.shapes {
		for range want[sh.Name] {
			req := sh.request()
			if err := m.capsLocked(&req, false); err != nil {
				m.log.Info("pool: node caps reached; shape waits", "shape", sh.Name, "cap", err)
				break
			}
			id := m.newIDLocked()
			prefixes, err := m.allocCIDRsLocked(req.Networks, foreign, host)
			if err != nil {
				m.log.Warn("pool: no range for a member", "shape", sh.Name, "err", err)
				break
			}
			bctx, cancel := context.WithTimeout(ctx, m.o.CreateTimeout)
			rec := newRecord(id, req, prefixes, now, cancel)
			rec.Owner = "pool:" + sh.Name
			rec.egress = &apitype.EgressPolicy{Mode: "none"}
			rec.member = &memberInfo{shape: sh.Name, template: tmpl[sh.Name]}
			m.members[id] = rec
			batch = append(batch, rec)
			ctxs, cancels = append(ctxs, bctx), append(cancels, cancel)
		}
	}
	m.poolGaugesLocked()
	return batch, ctxs, cancels
}

// buildMembers builds a planned batch; see refill.
func (m *Engine) buildMembers(ctx context.Context, batch []*record, ctxs []context.Context, tmpl map[string]int, start time.Time) {
	errs := make([]error, len(batch))
	if err := m.pools.EnsurePool(ctx, m.o.Pool); err != nil {
		for i := range errs {
			errs[i] = pxErr("ensure pool", err)
		}
	}
	zoned := false
	for i, r := range batch {
		if errs[i] == nil {
			errs[i] = m.buildZone(ctxs[i], r)
			zoned = zoned || errs[i] == nil
		}
	}
	if zoned {
		var zonedRecs []*record
		for i, r := range batch {
			if errs[i] == nil {
				zonedRecs = append(zonedRecs, r)
			}
		}
		err := m.applySDNFor(ctx, zonedRecs...)
		if err == nil {
			err = m.publishZones(ctx)
		}
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	var wg sync.WaitGroup
	for i, r := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := errs[i]
			if err == nil {
				err = m.applyEgress(ctxs[i], r)
			}
			if err == nil {
				err = m.buildVMs(ctxs[i], r, []int{tmpl[r.member.shape]}, nil)
			}
			m.memberBuilt(ctx, r, err, start)
		}()
	}
	wg.Wait()
}

// memberBuilt makes a built member ready, or tears a failed one down.
func (m *Engine) memberBuilt(ctx context.Context, r *record, err error, start time.Time) {
	m.mu.Lock()
	shape := r.member.shape
	if err == nil && r.member.yielding { // chosen to give way as it finished
		err = fmt.Errorf("member %s gave way to a cold create: %w", r.ID, context.Canceled)
	}
	if err == nil {
		r.State = apitype.StateReady
		r.CreatedAt = m.o.Now()
		if sh, ok := m.pool.shape(shape); ok && sh.MaxAge > 0 {
			r.ExpiresAt = r.CreatedAt.Add(sh.MaxAge)
		}
	}
	m.poolGaugesLocked()
	m.mu.Unlock()
	if err != nil && ctx.Err() != nil {
		// Shutting down: the state file says "creating", so the next
		// start's Reconcile tears it down; the daemon does not wait here.
		m.log.Info("pool: member left half-built at shutdown", "sandbox", r.ID, "shape", shape)
		return
	}
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			m.log.Warn("pool: member failed; tearing it down", "sandbox", r.ID, "shape", shape, "err", err)
		}
		m.scrap(ctx, r, err, m.forgetMember)
		return
	}
	m.pool.refill.WithLabelValues(shape).Observe(time.Since(start).Seconds())
	if err := m.saveState(); err != nil {
		m.log.Error("save state", "err", err)
	}
}

// readopt takes the members of the state file back after a restart: a
// member whose state was ready and whose VMs all exist, carry the node,
// sandbox and pool tags and run is a member again; any other is torn down
// (a teardown that fails leaves it, in state error, for the pool's next
// check). known receives every id kept.
func (m *Engine) readopt(ctx context.Context, saved []memberState, byID map[int]VMInfo, rep *ReconcileReport, known map[string]bool) {
	for _, s := range saved {
		rec := &record{Sandbox: s.Sandbox, created: make(chan struct{}), member: &memberInfo{shape: s.Shape, template: s.Template}}
		close(rec.created)
		ok := s.Sandbox.State == apitype.StateReady
		for _, v := range s.Sandbox.VMs {
			info, found := byID[v.VMID]
			owner, tagged := m.ownedBy(info.Tags)
			if !found || !tagged || owner != s.Sandbox.ID || !slices.Contains(info.Tags, poolTag) || info.Status != "running" || info.Kind != v.Kind {
				ok = false
			}
		}
		if _, shaped := m.pool.shape(s.Shape); !shaped {
			ok = false // the shape is gone from the config
		}
		if ok {
			m.mu.Lock()
			m.members[s.Sandbox.ID] = rec
			m.mu.Unlock()
			known[s.Sandbox.ID] = true
			rep.PoolMembers = append(rep.PoolMembers, s.Sandbox.ID)
			continue
		}
		if err := m.teardown(ctx, rec); err != nil {
			rep.failed(m, "pool member "+s.Sandbox.ID, err)
			rec.State, rec.Error = apitype.StateError, "teardown on start failed: "+err.Error()
			m.mu.Lock()
			m.members[s.Sandbox.ID] = rec
			m.mu.Unlock()
			known[s.Sandbox.ID] = true
			continue
		}
		m.removeEgress(ctx, s.Sandbox.ID, s.Sandbox.Zone)
		rep.PoolTornDown = append(rep.PoolTornDown, s.Sandbox.ID)
	}
	m.mu.Lock()
	m.poolGaugesLocked()
	m.mu.Unlock()
}
