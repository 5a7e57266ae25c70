package apitype

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestScopeIncludes: admin implies exec, exec implies read; an unknown
// scope grants nothing.
func TestScopeIncludes(t *testing.T) {
	for _, tc := range []struct {
		have []string
		need string
		want bool
	}{
		{[]string{ScopeAdmin}, ScopeRead, true},
		{[]string{ScopeAdmin}, ScopeExec, true},
		{[]string{ScopeExec}, ScopeRead, true},
		{[]string{ScopeExec}, ScopeAdmin, false},
		{[]string{ScopeRead}, ScopeExec, false},
		{[]string{"root", "write"}, ScopeRead, false},
		{nil, ScopeRead, false},
		{[]string{ScopeRead, ScopeAdmin}, ScopeAdmin, true},
	} {
		if got := ScopeIncludes(tc.have, tc.need); got != tc.want {
			t.Errorf("ScopeIncludes(%v, %s) = %v, want %v", tc.have, tc.need, got, tc.want)
		}
	}
}

// TestProblem: a problem is an error naming its type (and detail), and its
// JSON members are the RFC 9457 ones plus the documented extensions.
func TestProblem(t *testing.T) {
	p := &Problem{Type: ProblemGuardRefused, Title: "t", Status: 429, Detail: "cap node_vms", Cap: "node_vms"}
	if p.Error() != "guard-refused: cap node_vms" || (&Problem{Type: ProblemInternal}).Error() != "internal" {
		t.Errorf("Error: %q", p.Error())
	}
	b, err := json.Marshal(p)
	if err != nil || string(b) != `{"type":"guard-refused","title":"t","status":429,"detail":"cap node_vms","cap":"node_vms"}` {
		t.Errorf("JSON: %s %v", b, err)
	}
	types := ProblemTypes()
	if !slices.Contains(types, ProblemTemplateNotHardened) || !slices.Contains(types, ProblemInvalidRequest) || len(types) != len(slices.Compact(slices.Sorted(slices.Values(types)))) {
		t.Errorf("ProblemTypes: %v", types)
	}
}
