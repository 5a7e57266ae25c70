package containment

import (
	"net/netip"
	"testing"
)

func TestWithEgress(t *testing.T) {
	spec := Spec{Gateway: netip.MustParseAddr("10.10.1.1"), Public: []netip.Addr{netip.MustParseAddr("203.0.113.10")},
		ExternalName: "x1.example.test", LocalName: "local.zone"}
	for _, tc := range []struct {
		mode              string
		internet, recurse Verdict
		controls          int // positive controls in the plan
	}{
		{"open", Reachable, Reachable, 3},
		{"", Reachable, Reachable, 3},
		{"allowlist", Blocked, Blocked, 1},
		{"none", Blocked, Blocked, 1},
	} {
		p := WithEgress(GuardPolicy(), tc.mode)
		if p.Internet != tc.internet || p.DNSRecursion != tc.recurse || p.Metadata != Blocked || p.ControlPlane != Blocked {
			t.Errorf("mode %q: %+v", tc.mode, p)
		}
		plan, err := NewPlan(spec, p)
		if err != nil {
			t.Fatalf("mode %q: %v", tc.mode, err)
		}
		n := 0
		for _, c := range plan.Checks {
			if c.Control {
				n++
			}
		}
		if n != tc.controls {
			t.Errorf("mode %q: %d positive controls, want %d", tc.mode, n, tc.controls)
		}
	}
	if p := WithEgress(LockdownPolicy(), "open"); p.Internet != Blocked {
		t.Error("an open sandbox under the lockdown must still expect the internet blocked")
	}
}
