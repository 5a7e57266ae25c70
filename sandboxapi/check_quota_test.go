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

// heldChecker is a Checker that holds each run until released. It
// records the owner each run's context is charged to and how many runs
// are in flight at once. (The check has no way to call into the other
// sandboxes' guests: CheckTarget carries none of them.)
type heldChecker struct {
	release  <-chan struct{}
	inFlight atomic.Int64
	peak     atomic.Int64
	mu       sync.Mutex
	owners   []string // OwnerOf of each run's ctx ("<none>" when unmarked)
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
	select {
	case <-c.release:
	case <-ctx.Done():
		return apitype.CheckReport{}, ctx.Err()
	}
	return apitype.CheckReport{Pass: true}, nil
}

// TestCheckTakesAnExecSlotOfTheSandboxOwner: POST .../check is a guest
// I/O call of the sandbox's owner (it runs the probe through the agent of
// the caller's VM): it holds one of the owner's exec slots and its
// context is marked with the owner (sandbox.WithOwner), so the qga budget
// charges it to that owner's share. Alice, holding her whole share of 8
// execs, starts 24 concurrent checks: every one is refused (429) and none
// runs; once her execs end, a check runs, charged to alice.
func TestCheckTakesAnExecSlotOfTheSandboxOwner(t *testing.T) {
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
	// Alice takes her whole exec share (until execsCtx ends).
	execsCtx, endExecs := context.WithCancel(ctx)
	defer endExecs()
	for range 8 {
		go apitest.PostExec(execsCtx, e.tcp.URL, a, sbA.ID, "a", apitype.ExecRequest{Argv: []string{"sleep", "86400"}, OutputLimit: 1 << 10}, false)
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
	var refused atomic.Int64
	for range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := ca.Check(ctx, sbA.ID, "a"); client.IsProblem(err, apitype.ProblemTooManyRequests) {
				refused.Add(1)
			}
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for ck.inFlight.Load()+refused.Load() < checks && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	peak := ck.peak.Load()
	ck.mu.Lock()
	owners := append([]string(nil), ck.owners...)
	ck.mu.Unlock()
	close(release)
	wg.Wait()
	t.Logf("checks in flight at once: %d; refused: %d; owners charged: %v", peak, refused.Load(), owners)
	if peak > 0 {
		t.Errorf("%d checks of alice ran at once while she held her whole exec share: the check takes no exec slot (want 429)", peak)
	}
	if refused.Load() != checks {
		t.Errorf("%d of %d checks refused with %s while alice held her whole exec share", refused.Load(), checks, apitype.ProblemTooManyRequests)
	}
	// her execs end: a check runs now, charged to alice
	endExecs()
	deadline = time.Now().Add(10 * time.Second)
	for {
		_, err := ca.Check(ctx, sbA.ID, "a")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("check after alice's execs ended: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ck.mu.Lock()
	defer ck.mu.Unlock()
	if len(ck.owners) == 0 || ck.owners[len(ck.owners)-1] != "alice" {
		t.Errorf("check contexts charged to %v, want alice (sandbox.WithOwner): the qga budget would count the check against no owner's share", ck.owners)
	}
}
