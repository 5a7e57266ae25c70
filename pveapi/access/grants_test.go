package access

import (
	"strings"
	"testing"
)

// TestEveryCallHasItsGrant: each call that needs a privilege maps to a
// grant whose role holds every privilege it needs (one of them for an
// any-of check), and every grant has what else it allows written down.
func TestEveryCallHasItsGrant(t *testing.T) {
	for _, c := range Calls() {
		if _, ok := GrantOf(c); !ok && c.ACLPath != "" {
			t.Errorf("%s %s needs %v on %s: no grant of the table gives it", c.Method, c.Path, c.Privs, c.ACLPath)
		}
	}
	for _, g := range Grants() {
		if alsoAllows[g.Path] == "" {
			t.Errorf("grant %s: what else it allows is not written down", g.Path)
		}
	}
	if tab := GrantTable(); !strings.Contains(tab, "| `/sdn` | PVEInspect (no) |") || !strings.Contains(tab, "| `/sdn/zones` | PVEInspect (yes) |") {
		t.Errorf("table:\n%s", tab)
	}
}
