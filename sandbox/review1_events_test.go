package sandbox_test

import (
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestReviewOneOwnerEvictsAnothersEvents (review1): the event ring
// (1024 events by default) is shared by every owner with no share each.
// A hostile owner's sandboxes publish egress-denied events at the rate
// its guests cause denials (up to 32 per sandbox per 5 s health round,
// plus health events); with ~32 sandboxes that is the whole ring every
// round. Bob's stream, resuming with Last-Event-ID after a short break
// (every stream is cut after an hour, and after a 30 s write stall),
// finds his own "deleted" event gone: a gap, though bob published two
// events in that time. Want: a per-owner part of the ring (or per-owner
// rings), so one owner's volume cannot evict another's events.
func TestReviewOneOwnerEvictsAnothersEvents(t *testing.T) {
	e := newEngine(t, nil)
	e.Publish(apitype.Event{Type: apitype.EventReady, Sandbox: "sbbob001", Owner: "bob"})
	last := e.LastEventID() // bob's stream saw this and then reconnects
	e.Publish(apitype.Event{Type: apitype.EventDeleted, Sandbox: "sbbob001", Owner: "bob"})
	for i := range 1024 { // one health round of mallory's 32 sandboxes
		e.Publish(apitype.Event{Type: apitype.EventEgressDenied, Sandbox: "sbmal001", Owner: "mallory", Time: time.Unix(int64(i), 0)})
	}
	b := e.EventsSince(last, sandbox.NewEventFilter("bob", nil, nil))
	if b.Lost || len(b.Events) != 1 {
		t.Errorf("bob resuming after his last event: lost=%v, %d events, want his one deleted event (mallory's volume evicted it)", b.Lost, len(b.Events))
	}
}
