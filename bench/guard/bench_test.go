package guard

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

func TestRunSmall(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("bench needs root (CI is set, so this is a failure)")
		}
		t.Skip("SKIPPING: bench needs root")
	}
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

func TestRunLayer2Small(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("bench needs root (CI is set, so this is a failure)")
		}
		t.Skip("SKIPPING: bench needs root")
	}
	var buf bytes.Buffer
	r, err := RunLayer2(context.Background(), Layer2Options{Ports: 20, Rounds: 1, Updates: 3}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + buf.String())
	if r.ApplyWith <= 0 || r.ApplyWithout <= 0 || r.UpdateWith <= 0 || r.UpdateWithout <= 0 || r.ZonesWith <= 0 {
		t.Errorf("non-positive figures: %+v", r)
	}
	if !strings.Contains(buf.String(), "20 guest ports") {
		t.Errorf("output does not name the port count:\n%s", buf.String())
	}
}
