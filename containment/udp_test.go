package containment

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/containment/probe"
)

// TestObserveUDP is the UDP rule, case by case.
func TestObserveUDP(t *testing.T) {
	row := Check{Target: probe.Target{Kind: probe.KindUDP, Addr: "10.0.0.1:123", Payload: probe.PayloadNTP, TimeoutMS: 2000}}
	control := row
	control.ByCanary = true
	cases := []struct {
		name            string
		c               Check
		outcome, canary probe.Outcome
		want            Verdict
		why             string // in the detail
	}{
		{"reply", row, probe.OutcomeReply, probe.OutcomeNoReply, Reachable, "UDP reply"},
		{"port unreachable", row, probe.OutcomeRefused, probe.OutcomeNoReply, Reachable, "reached the host"},
		{"prohibited", row, probe.OutcomeUnreachable, probe.OutcomeRefused, Blocked, "prohibited"},
		{"silent, canary refused", row, probe.OutcomeNoReply, probe.OutcomeRefused, Reachable, "silent service"},
		{"silent, canary replied", row, probe.OutcomeNoReply, probe.OutcomeReply, Reachable, "silent service"},
		{"silent, canary silent", row, probe.OutcomeNoReply, probe.OutcomeNoReply, Blocked, "canary on the same address silent too"},
		{"silent, canary unreachable", row, probe.OutcomeNoReply, probe.OutcomeUnreachable, Blocked, "silent too"},
		{"silent, canary unknown", row, probe.OutcomeNoReply, "", Errored, "canary is unknown"},
		{"probe error", row, probe.OutcomeError, probe.OutcomeRefused, Errored, "could not try"},
		{"control: canary refused", control, probe.OutcomeNoReply, probe.OutcomeRefused, Reachable, "ICMP errors reach the probe"},
		{"control: own closed port refused", control, probe.OutcomeRefused, probe.OutcomeNoReply, Reachable, "ICMP errors reach the probe"},
		{"control: both silent", control, probe.OutcomeNoReply, probe.OutcomeNoReply, Blocked, "no closed port"},
		{"control: canary unknown", control, probe.OutcomeNoReply, "", Errored, "no canary"},
	}
	for _, c := range cases {
		got, detail := observe(c.c, probe.Result{ID: "c1", Outcome: c.outcome, Canary: c.canary, Detail: "probe detail"})
		if got != c.want || !strings.Contains(detail, c.why) || !strings.Contains(detail, "probe detail") {
			t.Errorf("%s: %s %q, want %s with %q and the probe's detail", c.name, got, detail, c.want, c.why)
		}
	}
}

// TestUDPRows: which UDP rows a plan gets, and with what.
func TestUDPRows(t *testing.T) {
	spec := goldenSpec()
	spec.HostAddrs = append(spec.HostAddrs, spec.Gateway) // the node lists its gateway address too
	spec.LAN = append(spec.LAN, netip.MustParseAddrPort("192.168.77.10:22"))
	p, err := NewPlan(spec, GuardPolicy())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Check{}
	for _, c := range p.Checks {
		if c.Target.Kind == probe.KindUDP {
			got[c.Target.Addr] = c
		}
	}
	for addr, want := range map[string]struct {
		group   Group
		payload string
		control bool
	}{
		"127.0.0.1:9":        {GroupControl, "", true},
		"10.10.1.1:123":      {GroupControlPlane, probe.PayloadNTP, false},
		"10.10.1.1:5405":     {GroupControlPlane, "", false},
		"192.0.2.2:53":       {GroupControlPlane, probe.PayloadDNS, false},
		"10.10.2.50:53":      {GroupOtherZone, probe.PayloadDNS, false},
		"192.168.77.10:161":  {GroupLAN, "", false},
		"203.0.113.10:33434": {GroupInternet, "", true},
	} {
		c, ok := got[addr]
		if !ok {
			t.Errorf("no UDP row for %s", addr)
			continue
		}
		if c.Group != want.group || c.Target.Payload != want.payload || c.Control != want.control {
			t.Errorf("%s: %+v", addr, c)
		}
	}
	if _, ok := got["10.10.1.1:53"]; ok {
		t.Error("a UDP row for the zone resolver on the gateway (allowed, covered by the DNS rows)")
	}
	n := 0
	for _, c := range p.Checks {
		if c.Target.Addr == "10.10.1.1:123" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d rows for 10.10.1.1:123, want 1 (the gateway listed as a host address too)", n)
	}
	lanRows := 0
	for _, c := range p.Checks {
		if c.Group == GroupLAN && c.Target.Kind == probe.KindUDP {
			lanRows++
		}
	}
	if lanRows != len(DefaultPeerUDPPorts()) {
		t.Errorf("%d LAN UDP rows for one address on two TCP ports, want %d", lanRows, len(DefaultPeerUDPPorts()))
	}
}

// TestUDPRowsUnderEgress: an egress policy redirects guest DNS to the
// node's resolver, so no udp 53 row is planned, nor the public canary.
func TestUDPRowsUnderEgress(t *testing.T) {
	for _, mode := range []string{"allowlist", "none"} {
		p, err := NewPlan(goldenSpec(), WithEgress(GuardPolicy(), mode))
		if err != nil {
			t.Fatal(err)
		}
		udp := 0
		for _, c := range p.Checks {
			if c.Target.Kind != probe.KindUDP {
				continue
			}
			udp++
			if strings.HasSuffix(c.Target.Addr, ":53") || c.Group == GroupInternet {
				t.Errorf("%s: row %q", mode, c.Name)
			}
		}
		if udp == 0 {
			t.Errorf("%s: no UDP rows at all", mode)
		}
	}
}
