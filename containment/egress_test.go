package containment

import (
	"net/netip"
	"testing"

	"github.com/pve-inspect/pve-inspect/containment/probe"
)

func TestWithEgress(t *testing.T) {
	spec := Spec{Gateway: netip.MustParseAddr("10.10.1.1"), Public: []netip.Addr{netip.MustParseAddr("203.0.113.10")},
		ExternalName: "x1.example.test", LocalName: "local.zone"}
	for _, tc := range []struct {
		mode              string
		internet, recurse Verdict
		controls          int // positive controls in the plan
	}{
		// the resolver, public HTTP and HTTPS, the UDP self-check and public canary
		{"open", Reachable, Reachable, 5},
		{"", Reachable, Reachable, 5},
		{"allowlist", Blocked, Blocked, 1}, // the UDP self-check (no public canary under an egress policy)
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

func TestEgressRows(t *testing.T) {
	spec := Spec{Gateway: netip.MustParseAddr("10.10.1.1"), ExternalName: "x1.example.test", LocalName: "local.zone",
		Egress: &EgressSpec{AllowedName: "example.test", DeniedName: "other.example.test", DeniedAddr: netip.MustParseAddr("198.51.100.7")}}
	plan, err := NewPlan(spec, WithEgress(GuardPolicy(), "allowlist"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []Check
	for _, c := range plan.Checks {
		if c.Group == GroupEgress && c.Target.Name != "local.zone" {
			rows = append(rows, c)
		}
	}
	// resolves, connects, disallowed name, SNI, Host (issue 24), tcp
	// 8443, tcp 22, udp 443 to the allowed name's address (issue 24),
	// disallowed address
	if len(rows) != 9 {
		t.Fatalf("%d egress rows, want 9: %+v", len(rows), rows)
	}
	want := []struct {
		expect          Verdict
		control, needed bool
	}{{Reachable, true, true}, {Reachable, true, true}, {Blocked, false, true}, {Blocked, false, true},
		{Blocked, false, true}, {Blocked, false, false}, {Blocked, false, false}, {Blocked, false, false}, {Blocked, false, false}}
	for i, w := range want {
		c := rows[i]
		if c.Expect != w.expect || c.Control != w.control || (c.NeedAnswer || c.NeedResponse) != w.needed {
			t.Errorf("row %d %q: %+v", i, c.Name, c)
		}
	}
	if sni := rows[3].Target; sni.Host != "other.example.test" || sni.Name != "example.test" || sni.Resolver != "10.10.1.1:53" {
		t.Errorf("SNI row target %+v", sni)
	}
	if h := rows[4].Target; h.Kind != probe.KindHTTP || h.Host != "other.example.test" || h.Name != "example.test" || h.Addr != "0.0.0.0:80" {
		t.Errorf("Host row target %+v", h)
	}
	for i, w := range []struct {
		kind probe.Kind
		addr string
	}{{probe.KindTCP, "0.0.0.0:8443"}, {probe.KindTCP, "0.0.0.0:22"}, {probe.KindUDP, "0.0.0.0:443"}} {
		if tg := rows[5+i].Target; tg.Kind != w.kind || tg.Addr != w.addr || tg.Name != "example.test" || tg.Resolver != "10.10.1.1:53" {
			t.Errorf("row %q target %+v, want %s %s of example.test", rows[5+i].Name, tg, w.kind, w.addr)
		}
		if err := probe.ValidateRequest(&probe.Request{Version: probe.Version, Targets: []probe.Target{rows[5+i].Target}}); err != nil {
			t.Errorf("row %q: the probe refuses its target: %v", rows[5+i].Name, err)
		}
	}
	// a connection closed before any HTTP response is a refusal, not a route
	v, _ := observe(rows[3], probe.Result{Outcome: probe.OutcomeOpen, Detail: "connected, no HTTP response: EOF"})
	if v != Blocked {
		t.Errorf("refused SNI observed as %s", v)
	}
	v, _ = observe(rows[1], probe.Result{Outcome: probe.OutcomeResponse, HTTPStatus: 200})
	if v != Reachable {
		t.Errorf("allowed connect observed as %s", v)
	}
	spec.Egress.DeniedName = ""
	if _, err := NewPlan(spec, WithEgress(GuardPolicy(), "allowlist")); err == nil {
		t.Error("an egress spec without a denied name was accepted")
	}
}
