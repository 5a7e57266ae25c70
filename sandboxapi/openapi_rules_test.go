package sandboxapi_test

import (
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestOpenAPICreateEgressByNode: a node without egress policies refuses
// every one, and its document has no egress in a create (a body the schema
// allows is not refused for it); a node with them has it.
func TestOpenAPICreateEgressByNode(t *testing.T) {
	for _, on := range []bool{false, true} {
		e := newEnv(t, func(o *options) {
			if on {
				o.Egress = &fakeEgress{policies: map[string]apitype.EgressPolicy{}}
			}
		})
		doc, err := e.c.OpenAPI(e.ctx())
		if err != nil {
			t.Fatal(err)
		}
		props := doc["components"].(map[string]any)["schemas"].(map[string]any)["CreateRequest"].(map[string]any)["properties"].(map[string]any)
		if _, has := props["egress"]; has != on {
			t.Errorf("egress enabled %v: the create schema has egress %v", on, has)
		}
		_, err = e.c.Create(e.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}, Egress: &apitype.EgressPolicy{Mode: "none"}})
		if (err == nil) != on {
			t.Errorf("egress enabled %v: a create with a policy: %v", on, err)
		}
	}
}
