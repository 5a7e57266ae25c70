package sandbox

import (
	"cmp"
	"container/heap"
	"slices"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// eventBus is the engine's bounded buffer of events (GET /v1/events): at
// most max events, ids growing by one, kept per owner so that one owner's
// volume cannot push out another's. When the buffer is full a publish
// drops the oldest event of the owner holding the most (its own when it
// holds as many): an owner's events leave the buffer only for its own
// newer ones, or once it holds more than any other owner. A publish is
// O(log owners) under the lock; readers copy the events they have not
// seen under the lock (one owner's only, for a stream bound to an owner)
// and filter and order them outside it (EventsSince), so no reader's
// filter, however large, and no slow stream ever holds up a publisher.
//
// An owner's egress events (EventEgress) are held apart from its other
// events, as an owner of their own (egressBucket), and an egress event
// never pushes out an event of another type: when the buffer is full it
// drops the oldest egress event of the owner holding the most of them
// (its own when it holds as many), or itself when none is buffered. So
// a sandbox's traffic can cost its owner old egress events, never its
// created, ready, health or deleted events, nor another owner's.
type eventBus struct {
	// hooks are test hooks (export_test.go), set before the engine is
	// used; nil in the daemon.
	hooks busHooks
	max   int

	// The mutex protects the following elements; a leaf.
	mu sync.Mutex
	// owners holds each owner's buffered events (an owner with none is
	// dropped); byCount orders them by how many they hold, most first.
	owners  map[string]*ownerEvents
	byCount ownerHeap
	held    int           // events buffered, at most max
	next    uint64        // the id of the next event (ids start at 1)
	dropped uint64        // the newest id dropped, of any owner
	gone    uint64        // the newest id dropped of an owner since forgotten
	notify  chan struct{} // closed and replaced on every publish
}

// ownerEvents are one owner's buffered events, oldest first: all but its
// egress events, or its egress events only (egress set).
type ownerEvents struct {
	owner   string // the bucket's key: the owner, or egressBucket of it
	egress  bool
	evs     []apitype.Event
	dropped uint64 // the newest of its ids dropped
	index   int    // in byCount
}

// ownerHeap is a max-heap of owners by the events they hold.
type ownerHeap []*ownerEvents

func (h ownerHeap) Len() int           { return len(h) }
func (h ownerHeap) Less(i, j int) bool { return len(h[i].evs) > len(h[j].evs) }
func (h ownerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *ownerHeap) Push(x any) {
	o := x.(*ownerEvents)
	o.index = len(*h)
	*h = append(*h, o)
}
func (h *ownerHeap) Pop() any {
	old := *h
	o := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return o
}

// busHooks let tests see where the bus's work happens.
type busHooks struct {
	// publish is called by every publish before it takes the lock.
	publish func()
	// filter is called for each event a reader filters (EventsSince).
	filter func()
}

// egressBucket is the key of owner's egress events.
func egressBucket(owner string) string { return owner + "\x00egress" }

// bucketOf is the key of e's bucket.
func bucketOf(e apitype.Event) string {
	if e.Type == apitype.EventEgress {
		return egressBucket(e.Owner)
	}
	return e.Owner
}

func newEventBus(max int) *eventBus {
	return &eventBus{max: max, owners: map[string]*ownerEvents{}, next: 1, notify: make(chan struct{})}
}

// publish stamps e with the next id and stores it, in place of the oldest
// event of the owner holding the most when the buffer is full.
func (b *eventBus) publish(e apitype.Event) apitype.Event {
	if b.hooks.publish != nil {
		b.hooks.publish()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	e.ID = b.next
	b.next++
	key, egress := bucketOf(e), e.Type == apitype.EventEgress
	if b.held == b.max {
		victim := b.byCount[0]
		if egress && !victim.egress {
			victim = b.fullestEgress()
		}
		if o := b.owners[key]; o != nil && (victim == nil || len(o.evs) >= len(victim.evs)) {
			victim = o // an owner as full as the fullest drops its own
		}
		if victim == nil {
			// no egress event to give way: this one is dropped
			b.dropped, b.gone = e.ID, e.ID
			close(b.notify)
			b.notify = make(chan struct{})
			return e
		}
		b.dropOldest(victim)
	}
	o := b.owners[key]
	if o == nil {
		o = &ownerEvents{owner: key, egress: egress}
		b.owners[key] = o
		heap.Push(&b.byCount, o)
	}
	o.evs = append(o.evs, e)
	b.held++
	heap.Fix(&b.byCount, o.index)
	close(b.notify)
	b.notify = make(chan struct{})
	return e
}

// fullestEgress is the egress bucket holding the most events (nil: none
// holds any). A scan, only when the buffer is full and its fullest
// bucket is not an egress one.
func (b *eventBus) fullestEgress() *ownerEvents {
	var best *ownerEvents
	for _, o := range b.byCount {
		if o.egress && (best == nil || len(o.evs) > len(best.evs)) {
			best = o
		}
	}
	return best
}

// dropOldest removes o's oldest event; an owner left with none is
// forgotten (its newest dropped id goes to gone).
func (b *eventBus) dropOldest(o *ownerEvents) {
	o.dropped = o.evs[0].ID
	b.dropped = max(b.dropped, o.dropped)
	o.evs[0] = apitype.Event{}
	o.evs = o.evs[1:]
	b.held--
	if len(o.evs) == 0 {
		heap.Remove(&b.byCount, o.index)
		delete(b.owners, o.owner)
		b.gone = max(b.gone, o.dropped)
		return
	}
	heap.Fix(&b.byCount, o.index)
}

// since copies the buffered events after id last of owner (""): every
// owner's), in no particular order, and says whether any of them after
// last were dropped (lost; all of them when last is newer than any
// given); the only work a reader does under the lock.
func (b *eventBus) since(last uint64, owner string) (evs []apitype.Event, lost bool, upto uint64, changed <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	upto, changed = b.next-1, b.notify
	if last > upto {
		lost, last = true, 0
	}
	after := func(o *ownerEvents) {
		i, _ := slices.BinarySearchFunc(o.evs, last+1, func(e apitype.Event, id uint64) int { return cmp.Compare(e.ID, id) })
		evs = append(evs, o.evs[i:]...)
	}
	if owner == "" {
		lost = lost || b.dropped > last
		for _, o := range b.owners {
			after(o)
		}
		return evs, lost, upto, changed
	}
	lost = lost || b.gone > last
	for _, key := range []string{owner, egressBucket(owner)} {
		if o := b.owners[key]; o != nil {
			lost = lost || o.dropped > last
			after(o)
		}
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
	evs, lost, upto, changed := m.events.since(last, f.owner)
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
		slices.SortFunc(kept, func(a, b apitype.Event) int { return cmp.Compare(a.ID, b.ID) })
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

// PublishNodeEvent publishes an event of the node rather than of a
// sandbox (a template build's): its owner and sandbox are cleared, so
// only streams bound to no owner (unbound tokens, the local socket)
// carry it, and it is held in a bucket of its own that no owner's events
// share. It never takes the engine's lock.
func (m *Engine) PublishNodeEvent(e apitype.Event) {
	e.Owner, e.Sandbox = "", ""
	m.emit(e)
}
