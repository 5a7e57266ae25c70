package pveemu

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// officialSchema finds apidata.json (PVE_APIDATA, else ../shared/pve-api
// next to the module root). The committed extract is what the emulator
// uses, so tests also run where the shared folder is absent: the checks
// against the official file are skipped then, loudly; under CI, where the
// shared folder lies beside the clone, its absence is a failure.
func officialSchema(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PVE_APIDATA"); p != "" {
		return p
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err == nil {
		root := filepath.Dir(strings.TrimSpace(string(out)))
		for _, p := range []string{filepath.Join(root, "..", "shared", "pve-api", "apidata.json"), filepath.Join(root, "..", "..", "shared", "pve-api", "apidata.json")} {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("official apidata.json not found beside the clone (../shared/pve-api) and CI is set; set PVE_APIDATA")
	}
	t.Skip("SKIPPED: official apidata.json not found; set PVE_APIDATA to check against it")
	return ""
}

// TestRoutesExistInSchema walks every route the emulator serves and proves
// it exists with that method in the committed extract, in paths.txt, and in
// the official schema itself when that is available.
func TestRoutesExistInSchema(t *testing.T) {
	e := newEnv(t)
	routes := e.s.Routes()
	if len(routes) < 60 {
		t.Fatalf("only %d routes", len(routes))
	}
	// The committed extract, parsed independently of LoadSchema.
	var extract struct {
		Endpoints map[string]json.RawMessage `json:"endpoints"`
	}
	raw, err := os.ReadFile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &extract); err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	f, err := os.Open("paths.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			listed[strings.Join(strings.Fields(l), " ")] = true
		}
	}
	served := map[string]bool{}
	for _, r := range routes {
		key := r.Method + " " + r.Path
		if served[key] {
			t.Errorf("route %s registered twice", key)
		}
		served[key] = true
		if _, ok := extract.Endpoints[key]; !ok {
			t.Errorf("%s not in schema.json", key)
		}
		if !listed[key] {
			t.Errorf("%s not in paths.txt", key)
		}
	}
	for key := range listed {
		if !served[key] {
			t.Errorf("paths.txt lists %s but the emulator does not serve it", key)
		}
	}

	official := officialSchema(t)
	rawOff, err := os.ReadFile(official)
	if err != nil {
		t.Fatal(err)
	}
	methods := map[string]bool{}
	var walk func(json.RawMessage)
	walk = func(r json.RawMessage) {
		var nodes []struct {
			Path     string                     `json:"path"`
			Info     map[string]json.RawMessage `json:"info"`
			Children json.RawMessage            `json:"children"`
		}
		if len(r) == 0 || json.Unmarshal(r, &nodes) != nil {
			return
		}
		for _, n := range nodes {
			for m := range n.Info {
				methods[m+" "+n.Path] = true
			}
			walk(n.Children)
		}
	}
	walk(rawOff)
	var missing []string
	for key := range served {
		if !methods[key] {
			missing = append(missing, key)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("not in the official schema: %v", missing)
	}
}

// TestSchemaExtractUpToDate regenerates the extract from the official
// schema and compares it with the committed schema.json.
func TestSchemaExtractUpToDate(t *testing.T) {
	official := officialSchema(t)
	out := filepath.Join(t.TempDir(), "schema.json")
	cmd := exec.Command("go", "run", "./internal/schemagen", "-in", official, "-paths", "paths.txt", "-out", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("schemagen: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("schema.json is stale: run PVE_APIDATA=... go generate ./testvm/pveemu")
	}
}

// TestSchemaPatternsCompile makes sure every pattern of the extract is
// enforced (none silently dropped).
func TestSchemaPatternsCompile(t *testing.T) {
	s, err := LoadSchema()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	var walk func(p *Prop)
	walk = func(p *Prop) {
		if p == nil {
			return
		}
		if p.Pattern != "" {
			n++
			if p.re == nil {
				t.Errorf("pattern %q not compiled", p.Pattern)
			}
		}
		for _, sub := range p.Properties {
			walk(sub)
		}
		for _, sub := range p.formatMap {
			walk(sub)
		}
		walk(p.Items)
	}
	for _, k := range s.Keys() {
		m, p, _ := strings.Cut(k, " ")
		ep, _ := s.Endpoint(m, p)
		walk(ep.Params)
	}
	if n == 0 {
		t.Fatal("no patterns found")
	}
}
