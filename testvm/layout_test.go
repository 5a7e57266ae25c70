package testvm

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// TestDependencyDirections keeps the layout honest: only tests, the demo
// and the bench import the test bed; only tests and the bench import
// bench/, internal/testkit and qga/wintest; pve-bootstrap and the packages it uses stay
// clear of the daemon's packages.
func TestDependencyDirections(t *testing.T) {
	out, err := exec.Command("go", "list", "-json=ImportPath,Imports", "github.com/pve-inspect/pve-inspect/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	const mod = "github.com/pve-inspect/pve-inspect/"
	deps := map[string][]string{}
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		deps[p.ImportPath] = p.Imports
	}
	if len(deps) < 5 {
		t.Fatalf("go list found only %d packages", len(deps))
	}
	// inBench: the bench command and its sections.
	inBench := func(p string) bool {
		rel := strings.TrimPrefix(p, mod)
		return rel == "bench" || strings.HasPrefix(rel, "bench/") || rel == "cmd/pve-inspect-bench"
	}
	allowedBed := func(p string) bool {
		rel := strings.TrimPrefix(p, mod)
		return strings.HasPrefix(rel, "testvm") || strings.HasPrefix(rel, "cmd/pve-inspect-demo") || inBench(p)
	}
	for p, imps := range deps {
		for _, i := range imps {
			if strings.HasPrefix(i, mod+"testvm") && !allowedBed(p) {
				t.Errorf("%s imports the test bed %s", p, i)
			}
			// Imports lists no test imports: tests may import both.
			for _, only := range []string{"bench", "internal/testkit", "qga/wintest"} {
				if (i == mod+only || strings.HasPrefix(i, mod+only+"/")) && !inBench(p) {
					t.Errorf("%s imports %s (only tests, bench/ and cmd/pve-inspect-bench may)", p, i)
				}
			}
		}
	}
	// Everything pve-bootstrap reaches, transitively.
	seen := map[string]bool{}
	var walk func(string)
	walk = func(p string) {
		if seen[p] {
			return
		}
		seen[p] = true
		for _, i := range deps[p] {
			if strings.HasPrefix(i, mod) {
				walk(i)
			}
		}
	}
	walk(mod + "cmd/pve-bootstrap")
	for p := range seen {
		rel := strings.TrimPrefix(p, mod)
		for _, banned := range []string{"firewall", "lockdown", "sandbox", "sandboxapi", "testvm"} {
			if rel == banned || strings.HasPrefix(rel, banned+"/") {
				t.Errorf("pve-bootstrap reaches %s", p)
			}
		}
	}
}

// TestEngineLayout keeps the sandbox API's three layers apart (tailscale's
// ipn / ipnlocal / localapi): the engine (sandbox) speaks no HTTP; the wire
// types (sandboxapi/apitype) import nothing of this module; the Go client
// and the MCP server speak the wire types, never the HTTP package; the
// engine's implementations (qga, containment, pveapi, diskxfer) import the
// engine, never the HTTP layer.
func TestEngineLayout(t *testing.T) {
	const mod = "github.com/pve-inspect/pve-inspect/"
	imports := func(pkg string, deps bool) []string {
		t.Helper()
		args := []string{"list", "-f", "{{join .Imports \"\\n\"}}", mod + pkg}
		if deps {
			args = []string{"list", "-deps", mod + pkg}
		}
		out, err := exec.Command("go", args...).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	for _, i := range imports("sandbox", false) {
		if i == "net/http" || strings.HasPrefix(i, "net/http/") || strings.HasPrefix(i, mod+"sandboxapi") && i != mod+"sandboxapi/apitype" {
			t.Errorf("the engine (sandbox) imports %s", i)
		}
	}
	for _, i := range imports("sandboxapi/apitype", true) {
		if strings.HasPrefix(i, mod) && i != mod+"sandboxapi/apitype" {
			t.Errorf("sandboxapi/apitype reaches %s", i)
		}
	}
	for _, p := range []string{"sandboxapi/client", "sandboxapi/mcpserver", "qga", "containment", "pveapi", "diskxfer"} {
		for _, i := range imports(p, true) {
			if i == mod+"sandboxapi" {
				t.Errorf("%s reaches the HTTP package sandboxapi", p)
			}
		}
	}
}
