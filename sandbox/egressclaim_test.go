package sandbox_test

import (
	"context"
	"sync"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// recordingEgress keeps denials per sandbox as the daemon's egress part
// does (one record per sandbox id, shown by Status) and starts a new
// record on Claim (sandbox.EgressClaimer).
type recordingEgress struct {
	fakeEgress
	mu      sync.Mutex
	denials map[string][]apitype.EgressDenial
	claims  int
	// entered and hold, when set, make Claim say it began and wait
	// before it starts the new instance
	entered, hold chan struct{}
}

func (r *recordingEgress) deny(sb, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.denials[sb] = append(r.denials[sb], apitype.EgressDenial{Reason: "mode", Name: name})
}

func (r *recordingEgress) Claim(ctx context.Context, sb, zone string, bridges []string, p apitype.EgressPolicy) error {
	if r.entered != nil {
		close(r.entered)
		<-r.hold
	}
	r.mu.Lock()
	delete(r.denials, sb)
	r.claims++
	r.mu.Unlock()
	return r.fakeEgress.Set(ctx, sb, zone, bridges, p)
}

func (r *recordingEgress) Remove(ctx context.Context, sb, zone string) error {
	r.mu.Lock()
	delete(r.denials, sb)
	r.mu.Unlock()
	return r.fakeEgress.Remove(ctx, sb, zone)
}

func (r *recordingEgress) Status(sb, zone string) apitype.EgressStatus {
	st := r.fakeEgress.Status(sb, zone)
	r.mu.Lock()
	defer r.mu.Unlock()
	st.Denials = append([]apitype.EgressDenial{}, r.denials[sb]...)
	return st
}

// Log is the sandbox's record: a DNS refusal per denial
// (sandbox.EgressRecorder).
func (r *recordingEgress) Log(sb string, _ sandbox.EgressLogFilter) apitype.EgressLog {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := apitype.EgressLog{Sandbox: sb, Records: []apitype.EgressRecord{}}
	for i, d := range r.denials[sb] {
		l.Records = append(l.Records, apitype.EgressRecord{Seq: uint64(i + 1), Type: "dns", Verdict: "refused", Reason: d.Reason, Name: d.Name})
	}
	return l
}

// TestPoolClaimWindowShowsNothing: while a claim runs (the sandbox is
// the claimer's, being created, and its policy not yet in force, so the
// egress part still holds the member's pre-claim record), the claimer's
// reads of the sandbox's egress status and record show none of the
// member's (review of issue 39: they did).
func TestPoolClaimWindowShowsNothing(t *testing.T) {
	ctx := context.Background()
	eg := &recordingEgress{fakeEgress: fakeEgress{policy: map[string]apitype.EgressPolicy{}}, denials: map[string][]apitype.EgressDenial{},
		entered: make(chan struct{}), hold: make(chan struct{})}
	b := newPoolBed(t, []sandbox.PoolShape{small(1)}, func(o *sandbox.Options) { o.Egress = eg })
	b.e.MaintainPool(ctx)
	members := b.e.Pool().Members
	if len(members) != 1 {
		t.Fatalf("%d members, want 1", len(members))
	}
	id := members[0].ID
	eg.deny(id, "pool-period.example.")
	req := oneVMSized("debian", 1, 512)
	req.Owner = "bob"
	done := make(chan error, 1)
	go func() {
		_, err := b.e.Create(ctx, req)
		done <- err
	}()
	<-eg.entered
	sb, ok := b.e.Get(id)
	if !ok || sb.Owner != "bob" || sb.State != apitype.StateCreating {
		t.Fatalf("during the claim: %+v %v, want bob's sandbox being created", sb, ok)
	}
	st, err := b.e.EgressStatus(sb)
	if err != nil || len(st.Denials) != 0 {
		t.Errorf("during the claim the claimer reads the member's denials: %+v %v", st.Denials, err)
	}
	l, err := b.e.EgressLog(sb, apitype.EgressLogQuery{})
	if err != nil || len(l.Records) != 0 {
		t.Errorf("during the claim the claimer reads the member's record: %+v %v", l, err)
	}
	close(eg.hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPoolClaimStartsEgressClean is issue 34 finding 6 (egress): a pool
// member's denials from before the claim showed in the claimer's GET
// .../egress (the member keeps its sandbox id, and the claim only Set the
// policy). Now the claim starts a new instance of the egress record
// (EgressClaimer); a cold create needs none.
func TestPoolClaimStartsEgressClean(t *testing.T) {
	ctx := context.Background()
	eg := &recordingEgress{fakeEgress: fakeEgress{policy: map[string]apitype.EgressPolicy{}}, denials: map[string][]apitype.EgressDenial{}}
	b := newPoolBed(t, []sandbox.PoolShape{small(1)}, func(o *sandbox.Options) { o.Egress = eg })
	b.e.MaintainPool(ctx)
	members := b.e.Pool().Members
	if len(members) != 1 {
		t.Fatalf("%d members, want 1", len(members))
	}
	// the member's guest asked for a name while it waited under "none"
	eg.deny(members[0].ID, "pool-period.example.")
	req := oneVMSized("debian", 1, 512)
	req.Owner = "bob"
	sb, err := b.e.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !sb.FromPool || sb.ID != members[0].ID {
		t.Fatalf("create %s (from pool %v), want the member %s claimed", sb.ID, sb.FromPool, members[0].ID)
	}
	st, err := b.e.EgressStatus(sb)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Denials) != 0 {
		t.Errorf("the claimer sees the pool member's denials: %+v", st.Denials)
	}
	if eg.claims != 1 {
		t.Errorf("%d claims told to the egress part, want 1", eg.claims)
	}
	if st.Policy.Mode != "open" {
		t.Errorf("claimed sandbox's policy %q, want the request's (open)", st.Policy.Mode)
	}
}
