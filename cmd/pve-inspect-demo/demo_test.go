package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestDemo runs the README's demo end to end with freshly built binaries,
// so the first command of the README stays true.
func TestDemo(t *testing.T) {
	testkit.RequireRoot(t)
	bin := t.TempDir()
	for _, pkg := range []string{"../pve-inspectd", "../pve-inspect-probe"} {
		cmd := exec.Command("go", "build", "-o", bin+"/", pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, options{binDir: bin, timeout: 10 * time.Minute}, &out)
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"leaks seen with no guard", "pve-inspectd status: the guard is in force", "sha256 equal",
		"pve-inspectd mcp (stdio): 12 tools", "exit 0: hello from",
		"lockdown in force", "every namespace, link, mount and process of the bed is gone"} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	// Two checks, each ending in "all probes PASS".
	if n := strings.Count(s, "all probes PASS"); n != 2 {
		t.Errorf("%d passing checks, want 2 (guard, then lockdown)", n)
	}
	if _, err := os.Stat(filepath.Join(bin, "pve-inspectd")); err != nil {
		t.Fatal(err)
	}
}
