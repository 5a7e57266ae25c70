package sandboxapi_test

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// heldChecker is a Checker that, like containment.SandboxChecker, asks
// every other sandbox's guest for its address (t.GuestOf(...).Exec), then
// holds until released. It records the owner each run's context is
// charged to and how many runs are in flight at once.
type heldChecker struct {
	release  <-chan struct{}
	inFlight atomic.Int64
	peak     atomic.Int64
	mu       sync.Mutex
	owners   []string // OwnerOf of each run's ctx ("<none>" when unmarked)
	foreign  atomic.Int64
}

func (c *heldChecker) Run(ctx context.Context, t sandbox.CheckTarget) (apitype.CheckReport, error) {
	n := c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	for {
		p := c.peak.Load()
		if n <= p || c.peak.CompareAndSwap(p, n) {
			break
		}
	}
	o, ok := sandbox.OwnerOf(ctx)
	if !ok {
		o = "<none>"
	}
	c.mu.Lock()
	c.owners = append(c.owners, o)
	c.mu.Unlock()
	for _, other := range t.Others {
		// containment.guestAddr: an exec in the other tenant's guest
		if _, err := t.GuestOf(other.VMs[0].VMID).Exec(ctx, sandbox.GuestExec{Argv: []string{"ip", "-4", "-o", "addr"}, Timeout: 10, OutputLimit: 64 << 10}); err == nil {
			c.foreign.Add(1)
		}
	}
	select {
	case <-c.release:
	case <-ctx.Done():
		return apitype.CheckReport{}, ctx.Err()
	}
	return apitype.CheckReport{Pass: true}, nil
}

// TestReviewCheckOutsideOwnerQuotas (review1): POST .../check is a guest
// I/O call (it runs probes through the agent of the caller's VM and an
// exec in every other sandbox's guest) but takes no exec slot and its
// context is not marked with the owner (sandbox.WithOwner), so the qga
// budget charges it to nobody's share. Alice, already holding her whole
// share of 8 execs, starts 24 concurrent checks: all run (want: refused
// with 429 past her share, and each run charged to alice). Each of them
// also runs an exec in Bob's guest, uncounted for either owner.
func TestReviewCheckOutsideOwnerQuotas(t *testing.T) {
	started := make(chan struct{}, 64)
	release := make(chan struct{})
	ck := &heldChecker{release: release}
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	e := newEnv(t, func(o *options) {
		o.Tokens = store
		o.Checker = ck
		dial := o.Guests
		o.Guests = func(p string) sandbox.Guest {
			return sleepyGuest{blockingGuest{Guest: dial(p), started: started, release: release}}
		}
	})
	mint := func(name, owner string) string {
		tok, _, err := store.CreateOwned(name, owner, []string{"admin"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	a, b := mint("a-agent", "alice"), mint("b-agent", "bob")
	ctx := e.ctx()
	ca := client.New(e.tcp.URL, client.WithToken(a))
	sbA, err := ca.Create(ctx, twoVMs())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.New(e.tcp.URL, client.WithToken(b)).Create(ctx, twoVMs()); err != nil {
		t.Fatal(err)
	}
	// Alice takes her whole exec share.
	for range 8 {
		go apitest.PostExec(ctx, e.tcp.URL, a, sbA.ID, "a", apitype.ExecRequest{Argv: []string{"sleep", "86400"}, OutputLimit: 1 << 10}, false)
	}
	for range 8 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("alice's execs did not start")
		}
	}
	if got := apitest.PostExec(ctx, e.tcp.URL, a, sbA.ID, "a", apitype.ExecRequest{Argv: []string{"true"}}, false); got.Code != 429 {
		t.Fatalf("alice's 9th exec: %+v, want 429 (she holds her share)", got)
	}
	const checks = 24
	var wg sync.WaitGroup
	for range checks {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = ca.Check(ctx, sbA.ID, "a") }()
	}
	deadline := time.Now().Add(5 * time.Second)
	for ck.inFlight.Load() < checks && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	peak := ck.peak.Load()
	ck.mu.Lock()
	owners := append([]string(nil), ck.owners...)
	ck.mu.Unlock()
	close(release)
	wg.Wait()
	t.Logf("checks in flight at once: %d; execs run in bob's guest for alice's checks: %d; owners charged: %v", peak, ck.foreign.Load(), owners)
	if peak > 0 && len(owners) > 0 && owners[0] != "alice" {
		t.Errorf("check context charged to %q, want alice (sandbox.WithOwner): the qga budget counts the check against no owner's share", owners[0])
	}
	if peak > 8 {
		t.Errorf("%d checks of alice ran at once while she held her whole exec share: the check takes no exec slot (want 429 past the share)", peak)
	}
}
