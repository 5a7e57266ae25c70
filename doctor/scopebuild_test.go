package doctor

import (
	"testing"

	"github.com/pve-inspect/pve-inspect/pveapi/access"
)

// TestScopeCheckAccessNetworkOnNode: download-url
// checks Sys.AccessNetwork on /nodes/{node} (pve-storage Status.pm
// download_url), where the token already holds Sys.Modify for the
// management-port rules; the scope check must fail it there too, and
// datastore allocation of templates (download-url's other half) too.
func TestScopeCheckAccessNetworkOnNode(t *testing.T) {
	nd := newNode(t)
	if err := nd.emu.AddRole("Builder", []string{"Sys.AccessNetwork"}); err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{access.User, nd.n.TokenID} {
		if err := nd.emu.SetACL("/nodes/pve", who, "Builder", false); err != nil {
			t.Fatal(err)
		}
	}
	want(t, run(t, ScopeCheck(nd.px, nd.n, access.Calls())), Fail, "Sys.AccessNetwork on /nodes/pve", "")
}

// TestScopeCheckAllocateTemplate: Datastore.AllocateTemplate on
// the image storage lets the token upload import images (pve-storage
// Status.pm upload: content import) under the names the recipes use.
func TestScopeCheckAllocateTemplate(t *testing.T) {
	nd := newNode(t)
	if err := nd.emu.AddRole("Uploader", []string{"Datastore.AllocateTemplate"}); err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{access.User, nd.n.TokenID} {
		if err := nd.emu.SetACL("/storage/local", who, "Uploader", false); err != nil {
			t.Fatal(err)
		}
	}
	want(t, run(t, ScopeCheck(nd.px, nd.n, access.Calls())), Fail, "Datastore.AllocateTemplate on /storage/local", "")
}
