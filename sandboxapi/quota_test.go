package sandboxapi_test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// sleepyGuest holds every exec of `sleep` like blockingGuest; other
// calls run at once.
type sleepyGuest struct{ blockingGuest }

func (g sleepyGuest) hold(ctx context.Context, r sandbox.GuestExec) error {
	if len(r.Argv) == 0 || r.Argv[0] != "sleep" {
		return nil
	}
	return g.blockingGuest.hold(ctx)
}

func (g sleepyGuest) Exec(ctx context.Context, r sandbox.GuestExec) (*apitype.ExecResult, error) {
	if err := g.hold(ctx, r); err != nil {
		return nil, err
	}
	return g.Guest.Exec(ctx, r)
}

func (g sleepyGuest) ExecStream(ctx context.Context, r sandbox.GuestExec, stdout, stderr io.Writer) (*apitype.ExecResult, error) {
	if err := g.hold(ctx, r); err != nil {
		return nil, err
	}
	return g.Guest.ExecStream(ctx, r, stdout, stderr)
}

// TestOwnerExecShare: with the default quotas (32 exec slots on the node,
// 8 per owner), owner A starts 32 long execs (collected and streamed,
// through two tokens of its own): 8 run, the other 24 are refused at once
// with 429 too-many-requests and a Retry-After, each counted for A; owner
// B's exec meanwhile runs. On a8ba2b8 all 32 of A's ran and B's exec was
// a 503.
func TestOwnerExecShare(t *testing.T) {
	started := make(chan struct{}, 64)
	release := make(chan struct{})
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	e := newEnv(t, func(o *options) {
		o.Tokens = store
		dial := o.Guests
		o.Guests = func(p string) sandbox.Guest {
			return sleepyGuest{blockingGuest{Guest: dial(p), started: started, release: release}}
		}
	})
	mint := func(name, owner string) string {
		t.Helper()
		tok, _, err := store.CreateOwned(name, owner, []string{"admin"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	a1, a2, b := mint("a-agent", "alice"), mint("a-other", "alice"), mint("b-agent", "bob")
	ctx := e.ctx()
	sbA, err := client.New(e.tcp.URL, client.WithToken(a1)).Create(ctx, twoVMs())
	if err != nil {
		t.Fatal(err)
	}
	sbB, err := client.New(e.tcp.URL, client.WithToken(b)).Create(ctx, twoVMs())
	if err != nil {
		t.Fatal(err)
	}
	defer close(release)

	exec := func(tok, id, vm string, argv []string, stream bool, out chan<- apitest.ExecAnswer) {
		// 1 MiB per stream: eight of them fit the owner's collected share
		out <- apitest.PostExec(ctx, e.tcp.URL, tok, id, vm, apitype.ExecRequest{Argv: argv, OutputLimit: 1 << 20}, stream)
	}
	const tries = 32
	refused := make(chan apitest.ExecAnswer, tries)
	for i := range tries {
		tok, vm := a1, "a"
		if i%2 == 1 {
			tok, vm = a2, "b"
		}
		go exec(tok, sbA.ID, vm, []string{"sleep", "86400"}, i%4 == 3, refused)
	}
	// Every try either runs (held by the guest) or is refused at once.
	held, refusals := 0, 0
	deadline := time.After(10 * time.Second)
	for held+refusals < tries {
		select {
		case <-started:
			held++
		case a := <-refused:
			refusals++
			if a.Code != http.StatusTooManyRequests || a.Type != apitype.ProblemTooManyRequests || a.Retry == "" || a.Quota != "exec-slots" {
				t.Errorf("A's exec past its share: %+v, want 429 too-many-requests with Retry-After naming quota exec-slots", a)
			}
		case <-deadline:
			t.Fatalf("after 10s: %d of A's execs held, %d refused", held, refusals)
		}
	}
	if held != 8 {
		t.Errorf("%d of A's execs run at once, want its share of 8", held)
	}
	if n := e.metric("pve_inspect_api_quota_refusals_total", "owner", "alice", "quota", "exec-slots"); n != float64(refusals) || n == 0 {
		t.Errorf("refusals counted for alice: %v, want %d", n, refusals)
	}

	// B's exec runs while A holds its share.
	done := make(chan apitest.ExecAnswer, 1)
	go exec(b, sbB.ID, "a", []string{"echo", "b"}, false, done)
	select {
	case a := <-done:
		if a.Code != http.StatusOK {
			t.Errorf("B's exec while A holds its share: %+v, want 200", a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("B's exec did not answer")
	}
}
