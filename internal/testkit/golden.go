package testkit

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

// update is the module's one -update flag: `go test ./pkg -update`
// rewrites the golden files (and every other generated fixture) of pkg.
var update = flag.Bool("update", false, "rewrite golden files and generated test fixtures")

// Update reports whether -update was given, for tests that regenerate a
// fixture other than through Golden.
func Update() bool { return *update }

// Golden compares got with testdata/name; with -update it writes got there
// first. A mismatch fails the test with both texts.
func Golden(tb testing.TB, name string, got []byte) {
	tb.Helper()
	GoldenFile(tb, filepath.Join("testdata", name), got)
}

// GoldenFile is Golden for a golden file outside testdata/ (a shipped file
// the test regenerates, such as packaging/deb/alerts_test.yml); p is
// relative to the package directory.
func GoldenFile(tb testing.TB, p string, got []byte) {
	tb.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, got, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		tb.Fatalf("golden %s: %v (run with -update to create it)", p, err)
	}
	if !bytes.Equal(got, want) {
		tb.Errorf("%s differs from the golden file (run with -update to accept):\n--- got\n%s\n--- want\n%s", p, got, want)
	}
}
