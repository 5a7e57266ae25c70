package sandbox

import (
	"context"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// EgressTally is a sandbox's egress record counts as an EgressCounter
// reads them.
type EgressTally struct {
	// Gen names the record's instance (another after a claim, or a
	// sandbox id used again).
	Gen uint64
	// Now are the instance's counts so far; Base the part of them from
	// before the daemon's start (restored with the record): the egress
	// events count from Base, so a restart announces nothing twice.
	Now, Base apitype.EgressCounts
}

// EgressCounter is an Egress that counts each sandbox's egress record
// (the daemon's does); the egress events come from it.
type EgressCounter interface {
	EgressCounts(sandbox string) (EgressTally, bool)
}

// EgressRestorer is an Egress that keeps the egress record across a
// restart of the daemon (the daemon's does): Reconcile hands it the
// sandboxes it has, once, when it succeeds, and the record of every
// other sandbox is dropped.
type EgressRestorer interface {
	RestoreEgress(sandboxes []string) error
}

// egressEvents is what the egress events keep of each sandbox: the
// counts its last egress event reached.
type egressEvents struct {
	// The mutex protects sent; held across one sandbox's read, compare
	// and publish (the bus's mutex is a leaf), never with Engine.mu.
	mu   sync.Mutex
	sent map[string]egressSent
}

// egressSent is what the last egress event of a sandbox instance counted
// up to.
type egressSent struct {
	rec    *record
	gen    uint64
	counts apitype.EgressCounts
}

// RunEgressEvents publishes, every HealthOptions.EgressInterval (1s),
// one egress event per ready sandbox whose egress record counted
// anything since its last one, until ctx ends. The events are counted
// increments read from the record, never one per record, so a guest's
// flood of names or connections costs the stream one event a second.
func (m *Engine) RunEgressEvents(ctx context.Context) {
	if _, ok := m.o.Egress.(EgressCounter); !ok {
		return
	}
	t := time.NewTicker(m.health.o.EgressInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.EgressEventRound()
		}
	}
}

// EgressEventRound publishes the egress events due now (RunEgressEvents
// calls it every interval) and forgets what was sent of sandboxes no
// longer in the table.
func (m *Engine) EgressEventRound() {
	ec, ok := m.o.Egress.(EgressCounter)
	if !ok {
		return
	}
	type sb struct {
		id, owner string
		rec       *record
	}
	m.mu.Lock()
	var ready []sb
	all := make(map[string]*record, len(m.sbx))
	for id, r := range m.sbx {
		all[id] = r
		if r.State == apitype.StateReady {
			ready = append(ready, sb{id, r.Owner, r})
		}
	}
	m.mu.Unlock()
	ee := m.egressEv
	ee.mu.Lock()
	defer ee.mu.Unlock()
	for id, s := range ee.sent {
		if all[id] != s.rec {
			delete(ee.sent, id)
		}
	}
	for _, s := range ready {
		m.egressEventLocked(ec, s.id, s.owner, s.rec)
	}
}

// egressEventLocked publishes sandbox id's egress event if its record
// counted anything since the last one; call with egressEv.mu held.
func (m *Engine) egressEventLocked(ec EgressCounter, id, owner string, rec *record) {
	t, ok := ec.EgressCounts(id)
	if !ok {
		return
	}
	ee := m.egressEv
	last, ok := ee.sent[id]
	if !ok || last.rec != rec || last.gen != t.Gen {
		last = egressSent{rec: rec, gen: t.Gen, counts: t.Base}
	}
	d, any := egressDelta(t.Now, last.counts)
	ee.sent[id] = egressSent{rec: rec, gen: t.Gen, counts: t.Now}
	if !any {
		return
	}
	m.emit(apitype.Event{Type: apitype.EventEgress, Sandbox: id, Owner: owner, Egress: &d})
}

// finalEgressEvent publishes what rec's sandbox's egress record counted
// since its last egress event, before its deleted event (its VMs are
// gone: nothing more is recorded), and forgets it.
func (m *Engine) finalEgressEvent(rec *record) {
	ec, ok := m.o.Egress.(EgressCounter)
	if !ok {
		return
	}
	m.mu.Lock()
	id, owner := rec.ID, rec.Owner
	m.mu.Unlock()
	ee := m.egressEv
	ee.mu.Lock()
	defer ee.mu.Unlock()
	m.egressEventLocked(ec, id, owner, rec)
	delete(ee.sent, id)
}

// egressDelta is now less last, field by field (a field that went down,
// which no instance's counts do, counts as zero), with Seq now's newest
// record; any is false when nothing was counted.
func egressDelta(now, last apitype.EgressCounts) (d apitype.EgressCounts, any bool) {
	sub := func(a, b uint64) uint64 {
		if a < b {
			return 0
		}
		return a - b
	}
	d = apitype.EgressCounts{DNSAnswered: sub(now.DNSAnswered, last.DNSAnswered), DNSRefused: sub(now.DNSRefused, last.DNSRefused),
		DNSFailed: sub(now.DNSFailed, last.DNSFailed), ConnAllowed: sub(now.ConnAllowed, last.ConnAllowed),
		ConnRefused: sub(now.ConnRefused, last.ConnRefused), ConnFailed: sub(now.ConnFailed, last.ConnFailed),
		Flows:    sub(now.Flows, last.Flows),
		BytesOut: sub(now.BytesOut, last.BytesOut), BytesIn: sub(now.BytesIn, last.BytesIn),
		Records: sub(now.Records, last.Records), Dropped: sub(now.Dropped, last.Dropped), Seq: now.Records}
	seq := d.Seq
	d.Seq = 0
	any = d != apitype.EgressCounts{}
	d.Seq = seq
	return d, any
}
