package sandbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestOwnerVolumeDoesNotEvictOthersEvents (from review1): the event ring
// (1024 events by default) was shared by every owner with no share each.
// A hostile owner's sandboxes publish egress-denied events at the rate
// its guests cause denials (up to 32 per sandbox per 5 s health round,
// plus health events); with ~32 sandboxes that is the whole ring every
// round. Bob's stream, resuming with Last-Event-ID after a short break
// (every stream is cut after an hour, and after a 30 s write stall),
// finds his own "deleted" event gone: a gap, though bob published two
// events in that time. Now: a per-owner part of the ring (or per-owner
// rings), so one owner's volume cannot evict another's events.
func TestOwnerVolumeDoesNotEvictOthersEvents(t *testing.T) {
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

// TestEventShareEviction: when the buffer is full the owner holding the
// most events (the publisher itself when it holds as many) loses its
// oldest; a stream bound to an owner sees a gap only when that owner's
// events were dropped, a stream of every owner when any were.
func TestEventShareEviction(t *testing.T) {
	e := newEngine(t, func(o *sandbox.Options) { o.Health.EventBuffer = 4 })
	pub := func(owner string, n int) {
		for range n {
			e.Publish(apitype.Event{Type: apitype.EventHealth, Sandbox: "sb" + owner, Owner: owner})
		}
	}
	pub("alice", 1) // 1
	pub("bob", 10)  // 2..11: bob drops his own (2..8), alice keeps hers
	pub("carol", 2) // 12, 13: each drops one of bob's (9, 10): he holds the most
	pub("alice", 1) // 14: carol holds the most (2): her 12 goes
	for _, tc := range []struct {
		owner string
		last  uint64
		want  []uint64
		lost  bool
	}{
		{"alice", 0, []uint64{1, 14}, false},
		{"bob", 0, []uint64{11}, true},
		{"bob", 10, []uint64{11}, false},
		{"carol", 0, []uint64{13}, true},
		{"carol", 12, []uint64{13}, false},
		{"", 0, []uint64{1, 11, 13, 14}, true},
		{"", 10, []uint64{11, 13, 14}, true},
		{"", 12, []uint64{13, 14}, false},
		{"dave", 0, nil, false},
	} {
		b := e.EventsSince(tc.last, sandbox.NewEventFilter(tc.owner, nil, nil))
		var got []uint64
		for _, ev := range b.Events {
			got = append(got, ev.ID)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) || b.Lost != tc.lost {
			t.Errorf("owner %q since %d: %v lost=%v, want %v lost=%v", tc.owner, tc.last, got, b.Lost, tc.want, tc.lost)
		}
	}
}
