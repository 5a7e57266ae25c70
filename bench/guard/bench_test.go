package guard

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func TestRunSmall(t *testing.T) {
	testkit.RequireRoot(t, "iptables", "ip6tables", "nft")
	var buf bytes.Buffer
	r, err := Run(context.Background(), Options{Rounds: 1, RouteChanges: 2}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + buf.String())
	if r.GuardApply <= 0 || r.IptablesApply <= 0 || r.RouteToSet <= 0 {
		t.Errorf("non-positive figures: %+v", r)
	}
	if r.IptablesRules != len(baselineRules()) || r.IptablesProcs < 2*r.IptablesRules {
		t.Errorf("baseline ran %d procs for %d rules: each rule needs a -C and an insert on a fresh node", r.IptablesProcs, r.IptablesRules)
	}
	if !strings.Contains(buf.String(), "ratio") {
		t.Errorf("no ratio printed:\n%s", buf.String())
	}
}
