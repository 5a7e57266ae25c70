package sandboxapi_test

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// compilingEgress is fakeEgress validating as the daemon's egress part
// does (egress.Compile) and saying its entry rules.
type compilingEgress struct{ *fakeEgress }

func (c compilingEgress) Validate(p apitype.EgressPolicy) error {
	_, err := egress.Compile(egress.Policy{Mode: p.Mode, Allow: p.Allow, Deny: p.Deny})
	return err
}

func (compilingEgress) EntryRules() sandbox.EgressEntryRules {
	return sandbox.EgressEntryRules{AllowPattern: egress.AllowEntryPattern(), DenyPattern: egress.DenyEntryPattern(),
		MaxChars: egress.MaxEntryChars, MaxEntries: egress.MaxEntries}
}

// TestOpenAPIEgressEntries: schemathesis ST202 (PUT egress and a create's
// egress: allow and deny entries were any string in the document, the
// daemon refused most). The document's entry pattern and length say
// exactly what the validator takes: on a table of entries of every kind, a
// PUT of the entry as the only allow (mode allowlist) or deny entry
// succeeds exactly when the document allows it. The document also says
// that only mode allowlist takes an allow list, and a node whose egress
// part says no rules keeps plain strings.
func TestOpenAPIEgressEntries(t *testing.T) {
	e := newEnv(t, func(o *options) { o.Egress = compilingEgress{&fakeEgress{policies: map[string]apitype.EgressPolicy{}}} })
	sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	doc, err := e.c.OpenAPI(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	pol := doc["components"].(map[string]any)["schemas"].(map[string]any)["EgressPolicy"].(map[string]any)
	props := pol["properties"].(map[string]any)
	long := strings.Repeat("a", 63)
	name253 := strings.Join([]string{long, long, long, strings.Repeat("b", 59)}, ".")
	table := []string{
		"", "*", "*.org", "localhost", "pypi.org", "PyPI.ORG.", "*.github.com", "a.*.org", "py pi.org", "pypi..org",
		"a_b.c-d.org", "a.1org", "a.org1", "\u212a.org", "é.org", long + ".org", long + "a.org", name253, name253 + ".",
		"github.com:22", "*.example.org:8443", "github.com:443", "github.com:80", "github.com:0", "github.com:022",
		"github.com:65535", "github.com:65536", "github.com:ssh", ":22",
		"203.0.113.7", "203.0.113.7:22", "203.0.113.07", "203.0.113.256", "10.0.0.256", "1.2.3",
		"2001:db8::1", "::ffff:1.2.3.4", "198.51.100.0/24", "203.0.113.7/24", "203.0.113.0/33", "0.0.0.0/0",
		"10.128.0.0/9", "10.64.0.0/9", "10.0.0.0/08", "2001:db8::/32",
	}
	for _, list := range []string{"allow", "deny"} {
		items := props[list].(map[string]any)["items"].(map[string]any)
		pattern, _ := items["pattern"].(string)
		maxLen, _ := items["maxLength"].(float64)
		if pattern == "" || maxLen == 0 {
			t.Fatalf("%s entries: no pattern or maxLength in the document: %v", list, items)
		}
		re := regexp.MustCompile(pattern)
		accepted := 0
		for _, entry := range table {
			p := apitype.EgressPolicy{Mode: "allowlist", Allow: []string{entry}}
			if list == "deny" {
				p = apitype.EgressPolicy{Mode: "open", Deny: []string{entry}}
			}
			body, _ := json.Marshal(p)
			resp := e.raw("PUT", "/v1/sandboxes/"+sb.ID+"/egress", "application/json", strings.NewReader(string(body)))
			resp.Body.Close()
			doc := len([]rune(entry)) <= int(maxLen) && re.MatchString(entry)
			if got := resp.StatusCode == http.StatusOK; got != doc {
				t.Errorf("%s entry %q: the document allows it %v, PUT egress answers %d", list, entry, doc, resp.StatusCode)
			}
			if doc {
				accepted++
			}
		}
		if min := map[string]int{"allow": 10, "deny": 4}[list]; accepted < min {
			t.Errorf("%s: only %d entries of the table accepted", list, accepted)
		}
	}
	// only mode allowlist takes an allow list: the document's anyOf, and
	// the daemon's answer
	anyOf, _ := pol["anyOf"].([]any)
	if len(anyOf) != 2 || !strings.Contains(mustJSON(t, anyOf), `"allowlist"`) || !strings.Contains(mustJSON(t, anyOf), `"maxItems":0`) {
		t.Errorf("EgressPolicy anyOf %v, want mode allowlist or an empty allow list", anyOf)
	}
	resp := e.raw("PUT", "/v1/sandboxes/"+sb.ID+"/egress", "application/json", strings.NewReader(`{"mode":"open","allow":["pypi.org"]}`))
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("allow list in mode open: %d, want 400", resp.StatusCode)
	}

	plain := newEnv(t, func(o *options) { o.Egress = &fakeEgress{policies: map[string]apitype.EgressPolicy{}} })
	doc, err = plain.c.OpenAPI(plain.ctx())
	if err != nil {
		t.Fatal(err)
	}
	pol = doc["components"].(map[string]any)["schemas"].(map[string]any)["EgressPolicy"].(map[string]any)
	if items := pol["properties"].(map[string]any)["allow"].(map[string]any)["items"].(map[string]any); items["pattern"] != nil {
		t.Errorf("an egress part without entry rules: allow items %v", items)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
