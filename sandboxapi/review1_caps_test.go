package sandboxapi_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// TestReviewSandboxCapsHaveNoOwnerShare (review1): the resource guard's
// caps (node_sandboxes, node_vms, node_vcpus, node_memory_mib; and, when
// unset, the node's VMIDs, memory and "auto" CIDRs) are node-wide only.
// One owner-bound token creates sandboxes up to the node cap and every
// other owner's create is refused until it deletes them (TTLs can be
// extended). Want: a per-owner share of the caps, like the exec slots.
func TestReviewSandboxCapsHaveNoOwnerShare(t *testing.T) {
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	e := newEnv(t, func(o *options) {
		o.Tokens = store
		o.Caps = sandbox.Caps{NodeSandboxes: 4}
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
	for i := range 4 {
		if _, err := ca.Create(e.ctx(), one); err != nil {
			t.Fatalf("alice's create %d: %v", i, err)
		}
	}
	_, err := cb.Create(e.ctx(), one)
	if err != nil {
		t.Errorf("bob's first sandbox refused while alice holds the node's every sandbox: %v", err)
	}
}
