package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestPublishDoesNotWaitForFilters is issue 34's stall (20 streams of
// ~7000-id filters over a full 1024-event buffer made a publish wait
// 320 ms), asserted structurally: while a reader is stopped in the middle
// of filtering (a hook holds it there), a publish completes. Before, the
// whole ring was filtered under the bus's lock, so the publish waited for
// the reader to finish, and each of the 20 readers in turn.
func TestPublishDoesNotWaitForFilters(t *testing.T) {
	const streams, filterIDs = 20, 7000
	e := newEngine(t, nil)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.OnFilter(func() { once.Do(func() { close(entered); <-release }) })
	for i := range 1024 {
		e.Publish(apitype.Event{Type: apitype.EventHealth, Sandbox: fmt.Sprintf("sb-busy%04d", i), Owner: "alice"})
	}
	filters := make([]sandbox.EventFilter, streams)
	for s := range filters {
		ids := make([]string, filterIDs)
		for i := range ids {
			ids[i] = fmt.Sprintf("sb-s%02dx%05d", s, i) // none buffered
		}
		if s == 0 {
			ids[filterIDs-1] = "sb-busy0007"
		}
		filters[s] = sandbox.NewEventFilter("", ids, nil)
	}
	var wg sync.WaitGroup
	got := make([]sandbox.EventBatch, streams)
	for s := range filters {
		wg.Go(func() { got[s] = e.EventsSince(0, filters[s]) })
	}
	<-entered
	published := make(chan struct{})
	go func() {
		e.Publish(apitype.Event{Type: apitype.EventHealth, Sandbox: "sb-new", Owner: "bob"})
		close(published)
	}()
	select {
	case <-published:
	case <-time.After(5 * time.Second):
		t.Error("a publish waited while a stream was filtering: the bus's lock is held across filtering")
	}
	close(release)
	<-published
	wg.Wait()
	for s, b := range got {
		want := 0
		if s == 0 {
			want = 1
		}
		// (a reader that ran after the publish lost event 1: Lost)
		if len(b.Events) != want || b.Upto < 1024 {
			t.Errorf("stream %d: %d events (want %d), upto %d", s, len(b.Events), want, b.Upto)
		}
	}
	if b := got[0]; len(b.Events) == 1 && b.Events[0].Sandbox != "sb-busy0007" {
		t.Errorf("stream 0 got %+v", b.Events[0])
	}
}

// TestEventRing: the ring keeps the newest events across its wrap, each
// resume point gets exactly the events after it, and a resume from before
// the ring (or from an id never given) reports the loss.
func TestEventRing(t *testing.T) {
	e := newEngine(t, func(o *sandbox.Options) { o.Health.EventBuffer = 4 })
	ids := func(b sandbox.EventBatch) string {
		var s []string
		for _, ev := range b.Events {
			s = append(s, fmt.Sprint(ev.ID))
		}
		return strings.Join(s, ",")
	}
	if b := e.EventsSince(0, sandbox.EventFilter{}); b.Lost || len(b.Events) != 0 || b.Upto != 0 {
		t.Fatalf("empty bus: %+v", b)
	}
	for i := range 10 {
		e.Publish(apitype.Event{Type: apitype.EventHealth, Sandbox: fmt.Sprintf("sb-%d", i%2)})
	}
	for _, tc := range []struct {
		last uint64
		f    sandbox.EventFilter
		want string
		lost bool
	}{
		{0, sandbox.EventFilter{}, "7,8,9,10", true},
		{5, sandbox.EventFilter{}, "7,8,9,10", true},
		{6, sandbox.EventFilter{}, "7,8,9,10", false},
		{8, sandbox.EventFilter{}, "9,10", false},
		{10, sandbox.EventFilter{}, "", false},
		{11, sandbox.EventFilter{}, "7,8,9,10", true},
		{6, sandbox.NewEventFilter("", []string{"sb-0"}, nil), "7,9", false},
		{6, sandbox.NewEventFilter("", []string{"sb-0", "sb-1"}, []string{apitype.EventDeleted}), "", false},
	} {
		b := e.EventsSince(tc.last, tc.f)
		if ids(b) != tc.want || b.Lost != tc.lost || b.Upto != 10 {
			t.Errorf("since %d: events %q lost=%v upto=%d, want %q lost=%v upto=10", tc.last, ids(b), b.Lost, b.Upto, tc.want, tc.lost)
		}
	}
}

// denyingEgress reports one denial for every sandbox.
type denyingEgress struct {
	*fakeEgress
	at time.Time
}

// EgressCounts counts one refused question for every sandbox.
func (d denyingEgress) EgressCounts(string) (sandbox.EgressTally, bool) {
	return sandbox.EgressTally{Gen: 1, Now: apitype.EgressCounts{DNSRefused: 1, Records: 1}}, true
}

func (d denyingEgress) Status(sb, zone string) apitype.EgressStatus {
	st := d.fakeEgress.Status(sb, zone)
	st.Denials = []apitype.EgressDenial{{Time: d.at, Reason: "name", Name: "example.com"}}
	return st
}

// TestNoPublishUnderEngineLock: every place the engine publishes (create,
// a failed create, ready, health, egress-denied, egress, expiring-soon, the
// reaper's expired, delete, a pool claim) does it with Engine.mu free: a hook run by every
// publish checks that the lock can be taken. Before, the reaper published
// expired under Engine.mu, so a publish waiting on the bus stalled the
// engine.
func TestNoPublishUnderEngineLock(t *testing.T) {
	ctx := context.Background()
	var (
		mu         sync.Mutex
		violations []string
		seen       = map[string]bool{}
	)
	hook := func(e *sandbox.Engine) func() {
		return func() {
			if !e.EngineLockFree(2 * time.Second) {
				mu.Lock()
				violations = append(violations, string(debug.Stack()))
				mu.Unlock()
			}
		}
	}
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	g := apitest.NewGuests()
	px := apitest.NewProxmox(g, map[string]int{"debian": 9000})
	e := newEngine(t, func(o *sandbox.Options) {
		o.Proxmox, o.Guests, o.Now = px, g.Dial, clk.now
		o.Egress = denyingEgress{fakeEgress: &fakeEgress{policy: map[string]apitype.EgressPolicy{}}, at: clk.now().Add(time.Second)}
		o.Health = sandbox.HealthOptions{AgentBrokenAfter: 20 * time.Second, ExpiringSoon: time.Minute}
	})
	e.OnPublish(hook(e))

	req := oneVM("debian")
	req.TTLSeconds = 600
	sb, err := e.Create(ctx, req) // created, ready
	if err != nil {
		t.Fatal(err)
	}
	e.CheckHealth(ctx)
	clk.add(2 * time.Second)
	e.CheckHealth(ctx)   // egress-denied (the denial is newer than the first round)
	e.EgressEventRound() // egress
	g.SetPingFails(sb.VMs[0].VMID, true)
	clk.add(25 * time.Second)
	e.CheckHealth(ctx) // health
	g.SetPingFails(sb.VMs[0].VMID, false)
	clk.add(9 * time.Minute)
	e.CheckHealth(ctx) // health, expiring-soon
	clk.add(time.Minute)
	if n := e.Reap(ctx); n != 1 { // expired, deleted
		t.Fatalf("reaped %d", n)
	}
	px.FailOnce("StartVM", errors.New("start refused"))
	if _, err := e.Create(ctx, req); err == nil { // created, deleted
		t.Fatal("a create whose VM does not start succeeded")
	}
	sb, err = e.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Delete(ctx, sb.ID); err != nil { // deleted
		t.Fatal(err)
	}

	pb := newPoolBed(t, []sandbox.PoolShape{small(1)}, nil)
	pb.e.OnPublish(hook(pb.e))
	pb.e.MaintainPool(ctx)
	if sb, err := pb.e.Create(ctx, oneVMSized("debian", 1, 512)); err != nil || !sb.FromPool { // created, ready
		t.Fatalf("pool claim: %v (from pool %v)", err, sb.FromPool)
	}

	// a template build's events (templatebuild.Service publishes them
	// from its own goroutines, through PublishNodeEvent)
	for _, typ := range []string{apitype.EventTemplateBuildProgress, apitype.EventTemplateBuildDone, apitype.EventTemplateBuildFailed} {
		e.PublishNodeEvent(apitype.Event{Type: typ, Template: "debian13", Owner: "someone", Sandbox: sb.ID})
	}
	if evs := e.EventsSince(0, sandbox.NewEventFilter("someone", nil, nil)).Events; len(evs) != 0 {
		t.Errorf("node events reach an owner's stream: %+v", evs)
	}

	for _, en := range []*sandbox.Engine{e, pb.e} {
		for _, ev := range en.EventsSince(0, sandbox.EventFilter{}).Events {
			seen[ev.Type] = true
		}
	}
	for _, typ := range apitype.EventTypes() {
		if !seen[typ] {
			t.Errorf("no %s event published: the test did not reach that site", typ)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Errorf("published with Engine.mu held:\n%s", v)
	}
	if len(violations) > 0 {
		t.Logf("%d of the publishes held Engine.mu", len(violations))
	}
}
