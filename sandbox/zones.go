package sandbox

import (
	"context"
	"fmt"
	"net/netip"
	"time"
)

// sdnBatch is one ApplySDN that several callers share: every caller that
// joined it had written its SDN changes before it joined, and the apply
// starts only after the batch is closed to newcomers, so it carries them
// all.
type sdnBatch struct {
	done chan struct{}
	err  error
	// own is set by a member that must see an apply of this engine's own
	// (a retry after a shared apply's reload did not come); shared tells
	// the members that another client's apply carried the batch.
	own, shared bool
}

// sdnSharer is the part of the Proxmox client that tells whether another
// client's apply has already committed this engine's SDN edits
// (pveapi.Client.EditsCommitted).
type sdnSharer interface {
	EditsCommitted(ctx context.Context) (bool, error)
}

// applySDN applies the pending SDN changes of the cluster (PUT
// /cluster/sdn); see applyBatch.
func (m *Engine) applySDN(ctx context.Context) error {
	_, err := m.applyBatch(ctx, false)
	return err
}

// applyBatch applies the pending SDN changes of the cluster (PUT
// /cluster/sdn), coalescing concurrent callers: a caller joins the next
// batch; when no apply runs it runs that batch itself, otherwise it waits
// until the running one ends and then either runs its batch or finds it
// run by another member of the batch. N creates or deletes that reach
// this point together make at most two applies, not N; a refill of many
// pool members makes one.
//
// Before it applies, the runner asks whether another client's apply (on a
// cluster, another node's daemon creating at the same time) has already
// committed every SDN edit of this engine (canShare): then that apply's
// worker reloads this node too, and the batch ends without an apply of
// its own, shared true. A member that needs an apply of this engine's own
// (own) makes the batch apply.
//
// The apply runs on a context without the caller's cancel, bounded by
// ApplyTimeout, not by the caller's own bound: the other members of the
// batch wait for it too, and an apply of a large cluster outlasts a
// teardown's bound (an abandoned wait leaves the apply running and the
// caller failed). An apply that took more than half of TeardownTimeout
// is logged as a warning.
func (m *Engine) applyBatch(ctx context.Context, own bool) (shared bool, err error) {
	m.sdnMu.Lock()
	if m.sdnNext == nil || m.o.UnbatchedApplies {
		m.sdnNext = &sdnBatch{done: make(chan struct{})}
	}
	b := m.sdnNext
	b.own = b.own || own
	if m.o.UnbatchedApplies {
		m.sdnNext = nil // a batch of one: nobody joins it
	}
	m.sdnMu.Unlock()
	select {
	case <-b.done:
		return b.shared, b.err
	case m.sdnRun <- struct{}{}:
	case <-ctx.Done():
		return false, fmt.Errorf("apply sdn: %w", ctx.Err())
	}
	defer func() { <-m.sdnRun }()
	m.sdnMu.Lock()
	select {
	case <-b.done: // run by another member while this one waited for the slot
		m.sdnMu.Unlock()
		return b.shared, b.err
	default:
	}
	if m.sdnNext == b {
		m.sdnNext = nil // newcomers join a fresh batch from here on
	}
	mustApply := b.own
	m.sdnMu.Unlock()
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.o.ApplyTimeout)
	defer cancel()
	if !mustApply && m.canShare() {
		done, err := m.o.Proxmox.(sdnSharer).EditsCommitted(actx)
		if err != nil {
			m.log.Warn("cannot tell whether another client's SDN apply carried this one's edits; applying", "err", err)
		} else if done {
			m.met.sdnShared.Inc()
			b.shared = true
			close(b.done)
			return true, nil
		}
	}
	if err := m.starts.Acquire(actx, allStarts); err != nil {
		b.err = fmt.Errorf("apply sdn: waiting for this node's VM starts: %w", err)
		close(b.done)
		return false, b.err
	}
	start := time.Now()
	b.err = pxErr("apply sdn", m.zones.ApplySDN(actx))
	took := time.Since(start)
	m.starts.Release(allStarts)
	m.lastApply.Store(int64(took))
	m.met.sdnApplies.Inc()
	m.met.sdnApplyTime.Observe(took.Seconds())
	if took > m.o.TeardownTimeout/2 {
		m.log.Warn("an SDN apply took long: its time grows with every DHCP zone of the cluster on every node; creates and deletes wait for it (up to [api] sdn_apply_timeout)",
			"took", took.Round(time.Millisecond), "bound", m.o.ApplyTimeout)
	}
	close(b.done)
	return false, b.err
}

// canShare says whether the engine may leave its apply to another
// client's: only where it can see that apply's reload reach this node
// (GatewayUp and BridgeUp), and never for the bench's baseline.
func (m *Engine) canShare() bool {
	_, ok := m.o.Proxmox.(sdnSharer)
	return ok && m.o.GatewayUp != nil && m.o.BridgeUp != nil && !m.o.UnbatchedApplies
}

// applySDNFor is applySDN for records whose vnets the apply must make.
// When another client's apply carried the batch (applyBatch), it waits
// for that apply's reload to put each vnet's bridge, with its gateway,
// on this node (waitShared) and applies itself when it does not come.
// Then, once an apply of its own ends OK, each record's vnet bridges are
// checked on this node (Options.BridgeUp), and while one is missing the
// apply is made again, after a pause that grows, Options.BridgeRetries
// times. A reload that started while another client's ran on the node is
// lost without a word (pve-manager API2/Network.pm reload_network_config
// takes no lock; ifupdown2's does not wait), and the task still ends OK.
func (m *Engine) applySDNFor(ctx context.Context, recs ...*record) error {
	shared, err := m.applyBatch(ctx, false)
	if err != nil {
		return err
	}
	if m.o.BridgeUp == nil {
		return nil
	}
	if shared {
		ready, err := m.waitShared(ctx, recs)
		if err != nil {
			return err
		}
		if ready {
			return nil
		}
		m.log.Info("another client's SDN apply committed this one's edits, but its reload has not made them on this node; applying")
		if _, err := m.applyBatch(ctx, true); err != nil {
			return err
		}
	}
	retries := m.o.BridgeRetries
	if retries <= 0 {
		retries = 3
	}
	for try := 0; ; try++ {
		missing, err := m.missingBridges(ctx, recs)
		if err != nil || len(missing) == 0 {
			return err
		}
		if try == retries {
			return pxErr("apply sdn", fmt.Errorf("ended OK %d times, but vnet bridges %v are not on this node (each reload lost to another client's?)", try+1, missing))
		}
		m.log.Warn("sdn apply ended OK without some of its bridges; applying again", "missing", missing, "try", try+1)
		m.met.sdnReapplies.Inc()
		select {
		case <-ctx.Done():
			return fmt.Errorf("apply sdn: %w", ctx.Err())
		case <-time.After(time.Duration(try+1) * 500 * time.Millisecond):
		}
		if _, err := m.applyBatch(ctx, true); err != nil {
			return err
		}
	}
}

// minSharedWait is the least time waitShared gives another client's apply
// to reach this node (an apply visits the nodes one after another, so
// this node's reload can come last).
const minSharedWait = 5 * time.Second

// waitShared waits, up to twice the engine's last apply (minSharedWait at
// least), until every vnet of recs is on this node with its gateway
// (GatewayUp), polling; it says whether they all came.
func (m *Engine) waitShared(ctx context.Context, recs []*record) (bool, error) {
	type net struct {
		vnet string
		gw   netip.Addr
	}
	var nets []net
	m.mu.Lock()
	for _, r := range recs {
		for _, n := range r.Networks {
			gw, err := netip.ParseAddr(n.Gateway)
			if err != nil {
				m.mu.Unlock()
				return false, fmt.Errorf("sandbox %s network %s: gateway %q: %w", r.ID, n.Name, n.Gateway, err)
			}
			nets = append(nets, net{n.VNet, gw})
		}
	}
	m.mu.Unlock()
	deadline := time.Now().Add(max(minSharedWait, 2*time.Duration(m.lastApply.Load())))
	for {
		ready := true
		for _, n := range nets {
			up, err := m.o.GatewayUp(ctx, n.vnet, n.gw)
			if err != nil {
				return false, fmt.Errorf("is bridge %s up with %s: %w", n.vnet, n.gw, err)
			}
			if !up {
				ready = false
				break
			}
		}
		if ready {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("apply sdn: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// missingBridges lists the vnets of recs whose bridge is not on the node.
func (m *Engine) missingBridges(ctx context.Context, recs []*record) ([]string, error) {
	var vnets, missing []string
	m.mu.Lock()
	for _, r := range recs {
		for _, n := range r.Networks {
			vnets = append(vnets, n.VNet)
		}
	}
	m.mu.Unlock()
	for _, v := range vnets {
		up, err := m.o.BridgeUp(ctx, v)
		if err != nil {
			return nil, fmt.Errorf("is bridge %s up: %w", v, err)
		}
		if !up {
			missing = append(missing, v)
		}
	}
	return missing, nil
}

// publishZones hands every known sandbox zone (warm pool members too) and
// its vnets to Options.ZonesChanged.
func (m *Engine) publishZones(ctx context.Context) error {
	if m.o.ZonesChanged == nil {
		return nil
	}
	m.zonesMu.Lock()
	defer m.zonesMu.Unlock()
	zones := map[string][]string{}
	m.mu.Lock()
	for _, set := range []map[string]*record{m.sbx, m.members} {
		for _, r := range set {
			for _, n := range r.Networks {
				zones[r.Zone] = append(zones[r.Zone], n.VNet)
			}
		}
	}
	m.mu.Unlock()
	if err := m.o.ZonesChanged(ctx, zones); err != nil {
		return fmt.Errorf("publish sandbox zones: %w", err)
	}
	return nil
}
