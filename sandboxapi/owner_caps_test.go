package sandboxapi_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// TestOwnerCapsLeaveRoomForOthers (review1's
// TestReviewSandboxCapsHaveNoOwnerShare): with the daemon's default owner
// caps (a quarter of each node cap) one owner-bound token creates
// sandboxes until refused guard-refused naming owner_sandboxes, one
// sandbox in (a quarter of 4), and another owner still creates its own.
// On a8ba2b8 the caps were node-wide only: alice created all four and
// bob's first create was refused.
func TestOwnerCapsLeaveRoomForOthers(t *testing.T) {
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	e := newEnv(t, func(o *options) {
		o.Tokens = store
		o.Caps = sandbox.Caps{NodeSandboxes: 4}.WithOwnerDefaults()
	})
	mint := func(name, owner string) string {
		tok, _, err := store.CreateOwned(name, owner, []string{"admin"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	ca := client.New(e.tcp.URL, client.WithToken(mint("a", "alice")))
	cb := client.New(e.tcp.URL, client.WithToken(mint("b", "bob")))
	one := apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "a", Template: "debian"}}}
	made := 0
	for i := range 4 {
		_, err := ca.Create(e.ctx(), one)
		if err == nil {
			made++
			continue
		}
		var p *apitype.Problem
		if !client.IsProblem(err, apitype.ProblemGuardRefused) || !errors.As(err, &p) || p.Cap != "owner_sandboxes" {
			t.Fatalf("alice's create %d: %v, want guard-refused on owner_sandboxes", i, err)
		}
	}
	if made != 1 {
		t.Errorf("alice made %d sandboxes, want her share of 1", made)
	}
	if _, err := cb.Create(e.ctx(), one); err != nil {
		t.Errorf("bob's first sandbox refused while alice holds her share: %v", err)
	}
}
