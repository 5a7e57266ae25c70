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

// officialSchema is the official schema the emulator is checked against:
// the full apidata.json when one is at hand (PVE_APIDATA, else
// ../shared/pve-api next to the module root), full true; otherwise the
// official entries of the served endpoints the repository keeps
// (testdata/apidata-extract.json, verbatim, written by internal/schemagen
// -extract), so a clone runs every check with nothing from outside.
func officialSchema(t *testing.T) (path string, full bool) {
	t.Helper()
	if p := os.Getenv("PVE_APIDATA"); p != "" {
		return p, true
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err == nil {
		root := filepath.Dir(strings.TrimSpace(string(out)))
		for _, p := range []string{filepath.Join(root, "..", "shared", "pve-api", "apidata.json"), filepath.Join(root, "..", "..", "shared", "pve-api", "apidata.json")} {
			if _, err := os.Stat(p); err == nil {
				return p, true
			}
		}
	}
	t.Log("checking against the committed official extract testdata/apidata-extract.json (no full apidata.json beside the clone)")
	return filepath.Join("testdata", "apidata-extract.json"), false
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

	official, _ := officialSchema(t)
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

// TestSchemaExtractUpToDate regenerates schema.json from the committed
// official extract and compares; with the full official schema at hand it
// also regenerates the extract from it and compares, so the extract is
// proven verbatim.
func TestSchemaExtractUpToDate(t *testing.T) {
	gen := func(in, extract string) []byte {
		t.Helper()
		out := filepath.Join(t.TempDir(), "schema.json")
		args := []string{"run", "./internal/schemagen", "-in", in, "-paths", "paths.txt", "-out", out}
		if extract != "" {
			args = append(args, "-extract", extract)
		}
		if b, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			t.Fatalf("schemagen: %v\n%s", err, b)
		}
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	want, err := os.ReadFile("schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gen(filepath.Join("testdata", "apidata-extract.json"), ""), want) {
		t.Fatal("schema.json is stale: run go generate ./testvm/pveemu")
	}
	official, full := officialSchema(t)
	if !full {
		return
	}
	extract := filepath.Join(t.TempDir(), "extract.json")
	if !bytes.Equal(gen(official, extract), want) {
		t.Fatal("schema.json differs from the official schema's entries")
	}
	got, err := os.ReadFile(extract)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join("testdata", "apidata-extract.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, committed) {
		t.Fatalf("testdata/apidata-extract.json is not the official schema's entries: regenerate it from %s (see generate.go)", official)
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
