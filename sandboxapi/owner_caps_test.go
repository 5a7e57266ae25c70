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

// TestCapacityNarrowedToOwner: GET /v1/capacity tells an owner-bound token
// the room its own creates will find (its owner caps), not the node's, so
// a client sizing its concurrency from it (the Inspect provider's
// default_concurrency) is not refused on owner_sandboxes; what it says fits
// is what the guard admits for that owner.
func TestCapacityNarrowedToOwner(t *testing.T) {
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	e := newEnv(t, func(o *options) {
		o.Tokens = store
		o.Caps = sandbox.Caps{NodeSandboxes: 8, NodeVMs: 8}.WithOwnerDefaults() // 2 sandboxes and 2 VMs an owner
	})
	mint := func(name, owner string) *client.Client {
		tok, _, err := store.CreateOwned(name, owner, []string{"admin"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return client.New(e.tcp.URL, client.WithToken(tok))
	}
	ca, cb := mint("a", "alice"), mint("b", "bob")
	one := apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "a", Template: "debian"}}}
	free := func(c *client.Client) apitype.CapacityUse {
		t.Helper()
		got, err := c.Capacity(e.ctx())
		if err != nil {
			t.Fatal(err)
		}
		return got.Free
	}
	for _, tc := range []struct {
		who        string
		c          *client.Client
		sandboxes  int
		vms        int
		createWant bool
	}{
		{"alice, empty node", ca, 2, 2, true},
		{"alice, one held", ca, 1, 1, true},
		{"alice, at her share", ca, 0, 0, false},
		{"bob, alice at hers", cb, 2, 2, true},
	} {
		f := free(tc.c)
		if f.Sandboxes != tc.sandboxes || f.VMs != tc.vms {
			t.Errorf("%s: free %+v, want %d sandboxes and %d VMs", tc.who, f, tc.sandboxes, tc.vms)
		}
		_, err := tc.c.Create(e.ctx(), one)
		if (err == nil) != tc.createWant {
			t.Errorf("%s: create %v, capacity said %d free", tc.who, err, f.Sandboxes)
		}
	}
}
