package sandboxapi_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// TestOwnerBoundTokens: tokens of the real token store bound to an owner
// (token create --owner) see and touch only that owner's sandboxes, and
// create sandboxes only for it; an unbound admin token sees all.
func TestOwnerBoundTokens(t *testing.T) {
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	now := time.Now()
	e := newEnv(t, func(o *options) { o.Tokens = store })
	mint := func(name, owner string) *client.Client {
		t.Helper()
		tok, _, err := store.CreateOwned(name, owner, []string{"admin"}, now)
		if err != nil {
			t.Fatal(err)
		}
		return client.New(e.tcp.URL, client.WithToken(tok))
	}
	alice, bob, admin := mint("alice-agent", "alice"), mint("bob-agent", "bob"), mint("ops", "")
	ctx := e.ctx()
	if _, _, err := store.CreateOwned("bad", "no spaces", []string{"read"}, now); err == nil {
		t.Error("owner with a space accepted")
	}

	sb, err := alice.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil || sb.Owner != "alice" {
		t.Fatalf("create by alice's token: %+v %v", sb, err)
	}
	if _, err := alice.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}, Owner: "bob"}); !client.IsProblem(err, apitype.ProblemInvalidRequest) {
		t.Errorf("alice's token creating for bob: %v, want invalid-request", err)
	}
	// bob sees nothing of alice's and can touch nothing of it.
	if l, err := bob.List(ctx); err != nil || len(l) != 0 {
		t.Errorf("bob's list: %+v %v", l, err)
	}
	notFound := map[string]error{}
	_, notFound["get"] = bob.Get(ctx, sb.ID)
	_, notFound["extend"] = bob.Extend(ctx, sb.ID, time.Hour)
	_, notFound["exec"] = bob.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"echo", "x"}})
	notFound["delete"] = bob.Delete(ctx, sb.ID)
	for op, err := range notFound {
		if !client.IsProblem(err, apitype.ProblemNotFound) {
			t.Errorf("bob %s on alice's sandbox: %v, want not-found", op, err)
		}
	}
	if _, err := alice.Get(ctx, sb.ID); err != nil {
		t.Errorf("alice's sandbox gone after bob's attempts: %v", err)
	}
	if res, err := alice.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"echo", "mine"}}); err != nil || string(res.Stdout) != "mine\n" {
		t.Errorf("alice exec: %+v %v", res, err)
	}
	if l, err := admin.List(ctx); err != nil || len(l) != 1 {
		t.Errorf("unbound admin's list: %+v %v", l, err)
	}
	if err := alice.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
