package sandboxapi

import (
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/qga"
)

// TestExecEnvDescribed: the document's exec env says the base environment
// the guest agent client really gives a command (qga.BaseEnv), entry by
// entry, so that the two cannot drift apart.
func TestExecEnvDescribed(t *testing.T) {
	t.Parallel()
	desc, _ := rule(t, "ExecRequest.env")["description"].(string)
	if desc == "" {
		t.Fatal("ExecRequest.env has no description")
	}
	for _, e := range qga.BaseEnv() {
		if !strings.Contains(desc, e) {
			t.Errorf("the description of ExecRequest.env does not name %s: %q", e, desc)
		}
	}
}
