package sandbox

import (
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// eventBus is the engine's bounded buffer of events (GET /v1/events): the
// newest max events, ids growing by one. Readers poll Since and wait on
// Changed; nothing blocks a publisher.
type eventBus struct {
	max int

	// The mutex protects the following elements; a leaf.
	mu     sync.Mutex
	buf    []apitype.Event // oldest first, at most max
	next   uint64          // the id of the next event (ids start at 1)
	notify chan struct{}   // closed and replaced on every publish
}

func newEventBus(max int) *eventBus {
	return &eventBus{max: max, next: 1, notify: make(chan struct{})}
}

// publish stamps e with the next id and appends it, dropping the oldest
// event when the buffer is full.
func (b *eventBus) publish(e apitype.Event) apitype.Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	e.ID = b.next
	b.next++
	if len(b.buf) == b.max {
		copy(b.buf, b.buf[1:])
		b.buf = b.buf[:b.max-1]
	}
	b.buf = append(b.buf, e)
	close(b.notify)
	b.notify = make(chan struct{})
	return e
}

// EventFilter selects events: an empty field matches everything.
type EventFilter struct {
	// Owner, when set, keeps only that owner's sandboxes' events.
	Owner string
	// Sandboxes and Types, when not empty, keep only those.
	Sandboxes, Types []string
}

func (f EventFilter) match(e apitype.Event) bool {
	if f.Owner != "" && e.Owner != f.Owner {
		return false
	}
	in := func(list []string, v string) bool {
		if len(list) == 0 {
			return true
		}
		for _, x := range list {
			if x == v {
				return true
			}
		}
		return false
	}
	return in(f.Sandboxes, e.Sandbox) && in(f.Types, e.Type)
}

// EventBatch is what EventsSince found.
type EventBatch struct {
	// Events are the buffered events after the id asked for that the
	// filter matches, oldest first.
	Events []apitype.Event
	// Lost is set when events after that id are no longer buffered (or
	// the id is from before a restart: newer than any given).
	Lost bool
	// Upto is the newest id looked at: ask again after it.
	Upto uint64
	// Changed is closed at the next publish.
	Changed <-chan struct{}
}

// EventsSince returns the buffered events after id last (0: all of
// them) that f matches.
func (m *Engine) EventsSince(last uint64, f EventFilter) EventBatch {
	b := m.events
	b.mu.Lock()
	defer b.mu.Unlock()
	out := EventBatch{Changed: b.notify, Upto: b.next - 1}
	if last >= b.next {
		out.Lost, last = true, 0
	} else if len(b.buf) > 0 && b.buf[0].ID > last+1 {
		out.Lost = true
	}
	for _, e := range b.buf {
		if e.ID > last && f.match(e) {
			out.Events = append(out.Events, e)
		}
	}
	return out
}

// LastEventID is the id of the newest event (0: none yet).
func (m *Engine) LastEventID() uint64 {
	b := m.events
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.next - 1
}

// emit publishes e, stamped with the clock.
func (m *Engine) emit(e apitype.Event) {
	if e.Time.IsZero() {
		e.Time = m.o.Now()
	}
	m.events.publish(e)
}

// emitSandbox publishes an event of type typ about rec's sandbox.
func (m *Engine) emitSandbox(typ string, rec *record, detail string) {
	m.mu.Lock()
	id, owner := rec.ID, rec.Owner
	m.mu.Unlock()
	m.emit(apitype.Event{Type: typ, Sandbox: id, Owner: owner, Detail: detail})
}

// expiryEvents sends expiring-soon once per expiry of a sandbox within the
// warning window.
func (m *Engine) expiryEvents(v sbView, t *sbTrack, now time.Time) {
	hm := m.health
	hm.mu.Lock()
	due := v.expires.Sub(now) <= hm.o.ExpiringSoon && !t.warned.Equal(v.expires)
	if due {
		t.warned = v.expires
	}
	hm.mu.Unlock()
	if due {
		exp := v.expires
		m.emit(apitype.Event{Type: apitype.EventExpiringSoon, Sandbox: v.id, Owner: v.owner, ExpiresAt: &exp})
	}
}

// egressEvents sends the egress denials newer than the last one sent.
func (m *Engine) egressEvents(v sbView, t *sbTrack) {
	if m.o.Egress == nil {
		return
	}
	st := m.o.Egress.Status(v.id, v.zone)
	hm := m.health
	hm.mu.Lock()
	since := t.denials
	var fresh []apitype.EgressDenial
	for _, d := range st.Denials {
		if d.Time.After(since) {
			fresh = append(fresh, d)
			if d.Time.After(t.denials) {
				t.denials = d.Time
			}
		}
	}
	hm.mu.Unlock()
	for _, d := range fresh {
		m.emit(apitype.Event{Type: apitype.EventEgressDenied, Sandbox: v.id, Owner: v.owner, Denial: &d, Time: d.Time})
	}
}
