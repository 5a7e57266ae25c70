package sandbox

import (
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// eventBus is the engine's bounded buffer of events (GET /v1/events): the
// newest len(ring) events, ids growing by one. A publish is O(1) under the
// lock: it stores the event in the ring and closes the wake-up channel;
// readers copy the events they have not seen under the lock and filter
// them outside it (EventsSince), so no reader's filter, however large,
// and no slow stream ever holds up a publisher.
type eventBus struct {
	// hooks are test hooks (export_test.go), set before the engine is
	// used; nil in the daemon.
	hooks busHooks

	// The mutex protects the following elements; a leaf.
	mu sync.Mutex
	// ring holds the newest events: event id i is at ring[(i-1)%len(ring)].
	ring   []apitype.Event
	held   int           // how many of ring hold events (len(ring) once full)
	next   uint64        // the id of the next event (ids start at 1)
	notify chan struct{} // closed and replaced on every publish
}

// busHooks let tests see where the bus's work happens.
type busHooks struct {
	// publish is called by every publish before it takes the lock.
	publish func()
	// filter is called for each event a reader filters (EventsSince).
	filter func()
}

func newEventBus(max int) *eventBus {
	return &eventBus{ring: make([]apitype.Event, max), next: 1, notify: make(chan struct{})}
}

// publish stamps e with the next id and stores it in place of the oldest
// event when the ring is full.
func (b *eventBus) publish(e apitype.Event) apitype.Event {
	if b.hooks.publish != nil {
		b.hooks.publish()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	e.ID = b.next
	b.ring[(b.next-1)%uint64(len(b.ring))] = e
	b.next++
	if b.held < len(b.ring) {
		b.held++
	}
	close(b.notify)
	b.notify = make(chan struct{})
	return e
}

// since copies the buffered events after id last (all of them when last is
// newer than any given: lost), oldest first; the only work a reader does
// under the lock.
func (b *eventBus) since(last uint64) (evs []apitype.Event, lost bool, upto uint64, changed <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	upto, changed = b.next-1, b.notify
	if last > upto {
		lost, last = true, 0
	}
	if oldest := b.next - uint64(b.held); last+1 < oldest {
		lost, last = true, oldest-1
	}
	evs = make([]apitype.Event, 0, upto-last)
	for id := last + 1; id <= upto; id++ {
		evs = append(evs, b.ring[(id-1)%uint64(len(b.ring))])
	}
	return evs, lost, upto, changed
}

// EventFilter selects events; build it with NewEventFilter. The zero
// filter matches everything.
type EventFilter struct {
	owner            string
	sandboxes, types map[string]struct{}
}

// NewEventFilter keeps only owner's sandboxes' events (owner "": every
// owner's) of the listed sandboxes and types (an empty list: all). The
// lists are held as sets: one lookup per event whatever their length.
func NewEventFilter(owner string, sandboxes, types []string) EventFilter {
	set := func(list []string) map[string]struct{} {
		if len(list) == 0 {
			return nil
		}
		s := make(map[string]struct{}, len(list))
		for _, v := range list {
			s[v] = struct{}{}
		}
		return s
	}
	return EventFilter{owner: owner, sandboxes: set(sandboxes), types: set(types)}
}

func (f EventFilter) match(e apitype.Event) bool {
	if f.owner != "" && e.Owner != f.owner {
		return false
	}
	in := func(s map[string]struct{}, v string) bool {
		if s == nil {
			return true
		}
		_, ok := s[v]
		return ok
	}
	return in(f.sandboxes, e.Sandbox) && in(f.types, e.Type)
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
// them) that f matches. The events are copied under the bus's lock and
// filtered after it is released.
func (m *Engine) EventsSince(last uint64, f EventFilter) EventBatch {
	evs, lost, upto, changed := m.events.since(last)
	out := EventBatch{Lost: lost, Upto: upto, Changed: changed}
	kept := evs[:0]
	for _, e := range evs {
		if m.events.hooks.filter != nil {
			m.events.hooks.filter()
		}
		if f.match(e) {
			kept = append(kept, e)
		}
	}
	if len(kept) > 0 {
		out.Events = kept
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

// emit publishes e, stamped with the clock. Never call it with m.mu held
// (TestNoPublishUnderEngineLock): a reader of the bus must never wait for
// the engine's lock, nor the engine for a reader.
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
