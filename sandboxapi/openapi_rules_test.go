package sandboxapi_test

import (
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
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

// TestOpenAPIEgressResponsesByNode: schemathesis ST101 (GET egress: 503)
// and ST202 (PUT egress with a policy the schema allows: 400) on a node
// without egress policies. Its document declares what the handlers answer
// there, status and problem type (taken here from the answers themselves);
// a node with egress policies answers 200 and declares nothing more.
func TestOpenAPIEgressResponsesByNode(t *testing.T) {
	for _, on := range []bool{false, true} {
		e := newEnv(t, func(o *options) {
			if on {
				o.Egress = &fakeEgress{policies: map[string]apitype.EgressPolicy{}}
			}
		})
		sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
		doc, err := e.c.OpenAPI(e.ctx())
		if err != nil {
			t.Fatal(err)
		}
		item := doc["paths"].(map[string]any)["/v1/sandboxes/{id}/egress"].(map[string]any)
		for _, tc := range []struct{ method, body string }{{"GET", ""}, {"PUT", `{"mode":"open"}`}} {
			resp := e.raw(tc.method, "/v1/sandboxes/"+sb.ID+"/egress", "application/json", strings.NewReader(tc.body))
			responses := item[strings.ToLower(tc.method)].(map[string]any)["responses"].(map[string]any)
			code := strconv.Itoa(resp.StatusCode)
			if on {
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || len(responses) != 2 {
					t.Errorf("egress on, %s: %d, document's responses %v", tc.method, resp.StatusCode, responses)
				}
				continue
			}
			p := decodeProblemResp(t, resp)
			declared, ok := responses[code].(map[string]any)
			if !ok {
				t.Errorf("egress off, %s answers %s (%s), which the document does not declare: %v", tc.method, code, p.Type, responses)
				continue
			}
			schema := declared["content"].(map[string]any)["application/problem+json"].(map[string]any)["schema"].(map[string]any)
			enum := schema["allOf"].([]any)[1].(map[string]any)["properties"].(map[string]any)["type"].(map[string]any)["enum"]
			if !slices.Contains(enum.([]any), any(p.Type)) {
				t.Errorf("egress off, %s: problem type %q not among the declared %v", tc.method, p.Type, enum)
			}
		}
	}
}

// TestOpenAPIEgressMode: schemathesis ST202 (any mode string was allowed)
// and ST201 (mode was required, an absent one is open): the document lists
// the modes, "" among them, and requires none of the policy's fields; each
// listed mode is one the node takes.
func TestOpenAPIEgressMode(t *testing.T) {
	e := newEnv(t, func(o *options) { o.Egress = &fakeEgress{policies: map[string]apitype.EgressPolicy{}} })
	doc, err := e.c.OpenAPI(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	pol := doc["components"].(map[string]any)["schemas"].(map[string]any)["EgressPolicy"].(map[string]any)
	if req, has := pol["required"]; has {
		t.Errorf("EgressPolicy requires %v", req)
	}
	enum, _ := pol["properties"].(map[string]any)["mode"].(map[string]any)["enum"].([]any)
	if len(enum) != 4 || !slices.Contains(enum, any("")) || !slices.Contains(enum, any("open")) {
		t.Fatalf("mode enum %v", enum)
	}
	sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	for _, m := range enum {
		if _, err := e.c.SetEgress(e.ctx(), sb.ID, apitype.EgressPolicy{Mode: m.(string)}); err != nil {
			t.Errorf("mode %q: %v", m, err)
		}
	}
}

// TestOpenAPIKindsByNode: a node that makes containers has kind lxc in its
// document; one that does not ([api] containers off) has only vm there,
// and refuses a container, so a client reading the document never sends
// one it would refuse.
func TestOpenAPIKindsByNode(t *testing.T) {
	for _, on := range []bool{false, true} {
		e := newEnv(t, func(o *options) {
			if on {
				o.Containers = apitest.NewCTs(o.Proxmox.(*apitest.Proxmox))
				o.CTGuests = func(int) sandbox.Guest { return nil }
			}
		})
		doc, err := e.c.OpenAPI(e.ctx())
		if err != nil {
			t.Fatal(err)
		}
		kind := doc["components"].(map[string]any)["schemas"].(map[string]any)["VMRequest"].(map[string]any)["properties"].(map[string]any)["kind"].(map[string]any)
		var enum []string
		for _, k := range kind["enum"].([]any) {
			enum = append(enum, k.(string))
		}
		if got := slices.Contains(enum, apitype.KindLXC); got != on {
			t.Errorf("containers %v: the document's kinds %q", on, enum)
		}
		if !on {
			_, err := e.c.Create(e.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", Kind: apitype.KindLXC}}})
			if err == nil {
				t.Error("containers off: a container was made")
			}
		}
	}
}

// TestOpenAPIVMOptionsByNode: the document's firmware, os_type and
// nic_controller enums are what the node takes ([api] allow_uefi,
// allow_windows, allow_e1000), and a value outside them is refused by
// the create, naming the field; disk_controller takes scsi and ide on
// every node.
func TestOpenAPIVMOptionsByNode(t *testing.T) {
	for _, on := range []bool{false, true} {
		e := newEnv(t, func(o *options) { o.AllowUEFI, o.AllowWindows, o.AllowE1000 = on, on, on })
		doc, err := e.c.OpenAPI(e.ctx())
		if err != nil {
			t.Fatal(err)
		}
		props := doc["components"].(map[string]any)["schemas"].(map[string]any)["VMRequest"].(map[string]any)["properties"].(map[string]any)
		enum := func(name string) []string {
			var out []string
			for _, v := range props[name].(map[string]any)["enum"].([]any) {
				out = append(out, v.(string))
			}
			return out
		}
		if got := slices.Contains(enum("firmware"), "uefi"); got != on {
			t.Errorf("allow_uefi %v: firmware enum %q", on, enum("firmware"))
		}
		if got := slices.Contains(enum("os_type"), "win11"); got != on {
			t.Errorf("allow_windows %v: os_type enum %q", on, enum("os_type"))
		}
		if d := enum("disk_controller"); !slices.Equal(d, []string{"", "scsi", "ide"}) {
			t.Errorf("disk_controller enum %q", d)
		}
		if got := slices.Contains(enum("nic_controller"), "e1000"); got != on || !slices.Contains(enum("nic_controller"), "virtio") {
			t.Errorf("allow_e1000 %v: nic_controller enum %q", on, enum("nic_controller"))
		}
		if !slices.Contains(enum("cpu"), "host") || slices.Contains(enum("cpu"), "max") {
			t.Errorf("cpu enum %q", enum("cpu"))
		}
		_, err = e.c.Create(e.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", Firmware: "uefi", OSType: "win11"}}})
		var p *apitype.Problem
		if on && err != nil {
			t.Errorf("allowed: %v", err)
		}
		if !on && (!errors.As(err, &p) || p.Field != "vms[0].firmware") {
			t.Errorf("not allowed: %v", err)
		}
		_, err = e.c.Create(e.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", NICController: "e1000"}}})
		if on && err != nil {
			t.Errorf("e1000 allowed: %v", err)
		}
		if !on && (!errors.As(err, &p) || p.Field != "vms[0].nic_controller" || !strings.Contains(p.Detail, "[api] allow_e1000 = true")) {
			t.Errorf("e1000 not allowed: %v", err)
		}
	}
}
