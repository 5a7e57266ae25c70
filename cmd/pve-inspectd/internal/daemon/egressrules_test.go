package daemon

import (
	"testing"

	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestEgressSaysEntryRules: the daemon's egress part says the entry rules
// its Validate applies (firewall/egress), so the API's document states
// them (sandboxapi's egressRuler, TestOpenAPIEgressEntries).
func TestEgressSaysEntryRules(t *testing.T) {
	var e sandbox.Egress = &Egress{}
	ruler, ok := e.(interface {
		EntryRules() sandbox.EgressEntryRules
	})
	if !ok {
		t.Fatal("the daemon's Egress says no entry rules")
	}
	r := ruler.EntryRules()
	if r.AllowPattern != egress.AllowEntryPattern() || r.DenyPattern != egress.DenyEntryPattern() ||
		r.MaxChars != egress.MaxEntryChars || r.MaxEntries != egress.MaxEntries {
		t.Errorf("EntryRules %+v, not firewall/egress's", r)
	}
}
