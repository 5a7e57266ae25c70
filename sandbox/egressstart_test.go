package sandbox_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// startingEgress is recordingEgress that also hears of first instances
// (sandbox.EgressStarter), and says which call each sandbox got, in order.
type startingEgress struct {
	recordingEgress
	calls []string // "start <id>", "set <id>", "claim <id>"
}

func (s *startingEgress) note(call, sb string) {
	s.mu.Lock()
	s.calls = append(s.calls, call+" "+sb)
	s.mu.Unlock()
}

func (s *startingEgress) Start(ctx context.Context, sb, zone string, bridges []string, p apitype.EgressPolicy) error {
	s.note("start", sb)
	return s.fakeEgress.Set(ctx, sb, zone, bridges, p)
}

func (s *startingEgress) Set(ctx context.Context, sb, zone string, bridges []string, p apitype.EgressPolicy) error {
	s.note("set", sb)
	return s.fakeEgress.Set(ctx, sb, zone, bridges, p)
}

func (s *startingEgress) Claim(ctx context.Context, sb, zone string, bridges []string, p apitype.EgressPolicy) error {
	s.note("claim", sb)
	return s.fakeEgress.Set(ctx, sb, zone, bridges, p)
}

// TestNewSandboxesStartEgress: the egress part hears a sandbox's first
// instance as such (EgressStarter: the daemon's clears the conntrack
// entries a deleted sandbox left on the same addresses there), for a
// pool member's build and a cold create alike; a claim is a Claim, and a
// policy change a Set, which must clear nothing (before, every one of
// them was a Set, and the daemon guessed a new sandbox from its registry
// not knowing the zone, which a sandbox older than egress policies also
// is).
func TestNewSandboxesStartEgress(t *testing.T) {
	ctx := context.Background()
	eg := &startingEgress{recordingEgress: recordingEgress{fakeEgress: fakeEgress{policy: map[string]apitype.EgressPolicy{}},
		denials: map[string][]apitype.EgressDenial{}}}
	b := newPoolBed(t, []sandbox.PoolShape{small(1)}, func(o *sandbox.Options) { o.Egress = eg })
	b.e.MaintainPool(ctx)
	members := b.e.Pool().Members
	if len(members) != 1 {
		t.Fatalf("%d members, want 1", len(members))
	}
	member := members[0].ID
	claimed, err := b.e.Create(ctx, oneVMSized("debian", 1, 512))
	if err != nil {
		t.Fatal(err)
	}
	if !claimed.FromPool || claimed.ID != member {
		t.Fatalf("create %s (from pool %v), want the member %s claimed", claimed.ID, claimed.FromPool, member)
	}
	cold, err := b.e.Create(ctx, oneVM("alpine"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.e.SetEgress(ctx, cold, apitype.EgressPolicy{Mode: "none"}); err != nil {
		t.Fatal(err)
	}
	eg.mu.Lock()
	got := slices.Clone(eg.calls)
	eg.mu.Unlock()
	// the refill after the claim starts a new member: keep only these two
	got = slices.DeleteFunc(got, func(c string) bool {
		return c != "start "+member && c != "claim "+member && !strings.HasSuffix(c, " "+cold.ID)
	})
	want := []string{"start " + member, "claim " + member, "start " + cold.ID, "set " + cold.ID}
	if !slices.Equal(got, want) {
		t.Errorf("egress calls %q, want %q", got, want)
	}
}
