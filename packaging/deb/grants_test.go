package deb

import (
	"os"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/pveapi/access"
)

// TestReadmeGrantTable: the package README's table of every grant of the
// daemon's token is the one pveapi/access generates (-update rewrites
// it).
func TestReadmeGrantTable(t *testing.T) {
	const begin, end = "<!-- grants:begin -->\n", "<!-- grants:end -->"
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatal("README.md has no grants block")
	}
	want := access.GrantTable()
	if got := s[i+len(begin) : j]; got != want {
		if testkit.Update() {
			if err := os.WriteFile("README.md", []byte(s[:i+len(begin)]+want+s[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("README.md's grant table differs from pveapi/access's (run with -update):\n%s", want)
	}
}
