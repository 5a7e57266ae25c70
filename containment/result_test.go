package containment

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/containment/probe"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func goldenSpec() Spec {
	return Spec{
		Gateway:      netip.MustParseAddr("10.10.1.1"),
		Subnet:       netip.MustParsePrefix("10.10.1.0/24"),
		HostAddrs:    []netip.Addr{netip.MustParseAddr("192.0.2.2")},
		ControlPorts: append(DefaultControlPorts(), Port{8443, "sandbox API"}, Port{9464, "metrics"}),
		Metadata:     []netip.Addr{netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("fd00:ec2::254")},
		MetadataDNS:  []netip.Addr{},
		OtherZone:    []netip.AddrPort{netip.MustParseAddrPort("10.10.2.50:22")},
		LAN:          []netip.AddrPort{netip.MustParseAddrPort("192.168.77.10:80")},
		Public:       []netip.Addr{netip.MustParseAddr("203.0.113.10")},
		Public6:      []netip.Addr{netip.MustParseAddr("2001:db8:100::10")},
		ExternalName: "example.test",
		LocalName:    "vm101.zone1.test",
	}
}

var goodFacts = probe.Facts{
	Interfaces:    []probe.Interface{{Name: "lo", Up: true, Addrs: []string{"127.0.0.1/8"}}, {Name: "eth0", Up: true, Addrs: []string{"10.10.1.57/24", "fe80::1/64"}}},
	DefaultRoute4: &probe.Route{Iface: "eth0", Gateway: "10.10.1.1"},
	Resolvers:     []string{"10.10.1.1"},
}

// goldenReport answers a guard-policy plan with a mix: most blocked, the
// API port refused (a leak), metadata PUT answering, one probe error.
func goldenReport(p *Plan) *probe.Report {
	rep := &probe.Report{Version: probe.Version, Facts: goodFacts}
	for _, c := range p.Checks {
		r := probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeTimeout, ElapsedMS: 3000}
		switch {
		case c.Target.Kind == probe.KindUDP:
			r = goldenUDP(c)
		case c.Target.Kind == probe.KindDNS:
			r = probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeResponse, RCode: "NOERROR", Answers: 1, ElapsedMS: 2}
		case c.Group == GroupInternet:
			r = probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeResponse, HTTPStatus: 200, ElapsedMS: 5}
		case c.Target.Addr == "10.10.1.1:8443":
			r = probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeRefused, Detail: "dial tcp 10.10.1.1:8443: connect: connection refused", ElapsedMS: 1}
		case c.Target.Addr == "169.254.169.254:80" && c.Target.Method == "PUT":
			r = probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeResponse, HTTPStatus: 200, ElapsedMS: 4}
		case c.Group == GroupIPv6:
			r = probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeUnreachable, Detail: "dial tcp [2001:db8:100::10]:80: connect: network is unreachable"}
		case c.Group == GroupLAN:
			r = probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeError, Detail: "socket: too many open files"}
		}
		rep.Results = append(rep.Results, r)
	}
	return rep
}

// goldenUDP: the canaries come back on loopback and the public address;
// the node's NTP is silent while its canary is refused (a leak: a silent
// service got the datagram); the other zone's guest is prohibited; the
// rest is silent with silent canaries.
func goldenUDP(c Check) probe.Result {
	r := probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeNoReply, Canary: probe.OutcomeNoReply, Detail: "no reply; canary port 61234: no reply", ElapsedMS: 3000}
	switch {
	case strings.HasPrefix(c.Target.Addr, "127.0.0.1:"), strings.HasPrefix(c.Target.Addr, "203.0.113.10:"):
		r = probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeRefused, Canary: probe.OutcomeRefused, Detail: "ICMP port unreachable; canary port 61234: ICMP port unreachable", ElapsedMS: 1}
	case c.Target.Addr == "192.0.2.2:123":
		r.Canary, r.Detail = probe.OutcomeRefused, "no reply; canary port 61234: ICMP port unreachable"
	case strings.HasPrefix(c.Target.Addr, "10.10.2.50:"):
		r = probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeUnreachable, Canary: probe.OutcomeUnreachable, Detail: "unreachable: read udp: no route to host", ElapsedMS: 1}
	}
	return r
}

func TestGoldenTable(t *testing.T) {
	plan, err := NewPlan(goldenSpec(), GuardPolicy())
	if err != nil {
		t.Fatal(err)
	}
	res := Evaluate(plan, goldenReport(plan))
	var text, js bytes.Buffer
	if err := res.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "table.golden", text.Bytes())
	testkit.Golden(t, "table.json.golden", js.Bytes())
	if res.Passed() {
		t.Error("leaks passed")
	}
	if !res.ControlsOK {
		t.Error("controls failed")
	}
	var failed []string
	for _, r := range res.Failed() {
		failed = append(failed, r.Target)
	}
	want := []string{"tcp 10.10.1.1:8443", "http PUT 169.254.169.254:80/latest/api/token", "tcp 192.168.77.10:80", "udp 192.0.2.2:123 ntp"}
	if strings.Join(failed, "|") != strings.Join(want, "|") {
		t.Errorf("failed %v, want %v", failed, want)
	}
}

// TestGoldenTableDeadNetwork renders a lockdown check whose resolver
// control failed: every blocked row is UNPROVEN.
func TestGoldenTableDeadNetwork(t *testing.T) {
	spec := goldenSpec()
	spec.ControlPorts = []Port{{8006, "Proxmox API"}}
	spec.HostAddrs = nil
	plan, err := NewPlan(spec, LockdownPolicy())
	if err != nil {
		t.Fatal(err)
	}
	rep := &probe.Report{Version: probe.Version, Facts: probe.Facts{Interfaces: []probe.Interface{{Name: "eth0", Up: true, Addrs: []string{}}}}}
	for _, c := range plan.Checks {
		r := probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeTimeout, ElapsedMS: 3000}
		if c.Target.Kind == probe.KindDNS {
			r.Outcome = probe.OutcomeNoReply
		}
		if c.Target.Kind == probe.KindUDP {
			r.Outcome, r.Canary = probe.OutcomeNoReply, probe.OutcomeNoReply
		}
		rep.Results = append(rep.Results, r)
	}
	res := Evaluate(plan, rep)
	var text bytes.Buffer
	if err := res.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "table-dead.golden", text.Bytes())
	if res.Passed() || res.ControlsOK {
		t.Errorf("dead network: passed=%v controls=%v", res.Passed(), res.ControlsOK)
	}
}

func TestEvaluate(t *testing.T) {
	spec := Spec{Gateway: netip.MustParseAddr("10.10.1.1"), Subnet: netip.MustParsePrefix("10.10.1.0/24"),
		ControlPorts: []Port{{22, "SSH"}}, Metadata: []netip.Addr{}, MetadataDNS: []netip.Addr{}, UDPPorts: []Port{}, PeerUDPPorts: []Port{},
		Public: []netip.Addr{netip.MustParseAddr("203.0.113.10")}, ExternalName: "example.test", LocalName: "vm.zone.test"}
	plan, err := NewPlan(spec, GuardPolicy())
	if err != nil {
		t.Fatal(err)
	}
	// checks: c1 resolver control, c2 ssh, c3 http, c4 https (internet controls), c5 recursion
	ok := map[string]probe.Result{
		"c1": {Outcome: probe.OutcomeResponse, RCode: "NOERROR", Answers: 1},
		"c2": {Outcome: probe.OutcomeTimeout},
		"c3": {Outcome: probe.OutcomeResponse, HTTPStatus: 200},
		"c4": {Outcome: probe.OutcomeOpen, Detail: "connected, no HTTP response: tls: handshake failure"},
		"c5": {Outcome: probe.OutcomeResponse, RCode: "NOERROR", Answers: 2},
	}
	cases := []struct {
		name     string
		facts    probe.Facts
		mod      map[string]probe.Result // replaces results; Outcome "" deletes
		pass     bool
		controls bool
		statuses string // per row, lease first
	}{
		{"all good", goodFacts, nil, true, true, "PASS PASS PASS PASS PASS PASS"},
		{"refused is reachable", goodFacts, map[string]probe.Result{"c2": {Outcome: probe.OutcomeRefused}}, false, true, "PASS PASS FAIL PASS PASS PASS"},
		{"unreachable is blocked", goodFacts, map[string]probe.Result{"c2": {Outcome: probe.OutcomeUnreachable}}, true, true, "PASS PASS PASS PASS PASS PASS"},
		{"probe error fails", goodFacts, map[string]probe.Result{"c2": {Outcome: probe.OutcomeError}}, false, true, "PASS PASS FAIL PASS PASS PASS"},
		{"missing result fails", goodFacts, map[string]probe.Result{"c2": {}}, false, true, "PASS PASS FAIL PASS PASS PASS"},
		{"NXDOMAIN recursion is blocked", goodFacts, map[string]probe.Result{"c5": {Outcome: probe.OutcomeResponse, RCode: "NXDOMAIN"}}, false, true, "PASS PASS PASS PASS PASS FAIL"},
		{"empty NOERROR is blocked", goodFacts, map[string]probe.Result{"c5": {Outcome: probe.OutcomeResponse, RCode: "NOERROR"}}, false, true, "PASS PASS PASS PASS PASS FAIL"},
		{"resolver control refused", goodFacts, map[string]probe.Result{"c1": {Outcome: probe.OutcomeResponse, RCode: "REFUSED"}}, false, false, "PASS FAIL UNPROVEN PASS PASS PASS"},
		{"internet control down", goodFacts, map[string]probe.Result{"c3": {Outcome: probe.OutcomeTimeout}}, false, false, "PASS PASS UNPROVEN FAIL PASS PASS"},
		{"no default route", probe.Facts{Interfaces: goodFacts.Interfaces}, nil, false, false, "FAIL PASS UNPROVEN PASS PASS PASS"},
		{"lease outside subnet", probe.Facts{Interfaces: []probe.Interface{{Name: "eth0", Addrs: []string{"192.168.1.5/24"}}}, DefaultRoute4: goodFacts.DefaultRoute4}, nil, false, false, "FAIL PASS UNPROVEN PASS PASS PASS"},
		{"wrong gateway", probe.Facts{Interfaces: goodFacts.Interfaces, DefaultRoute4: &probe.Route{Iface: "eth0", Gateway: "10.10.1.254"}}, nil, false, false, "FAIL PASS UNPROVEN PASS PASS PASS"},
		{"address on another interface", probe.Facts{Interfaces: goodFacts.Interfaces, DefaultRoute4: &probe.Route{Iface: "eth1", Gateway: "10.10.1.1"}}, nil, false, false, "FAIL PASS UNPROVEN PASS PASS PASS"},
	}
	for _, c := range cases {
		rep := &probe.Report{Version: 1, Facts: c.facts}
		for _, id := range []string{"c1", "c2", "c3", "c4", "c5"} {
			r := ok[id]
			if m, found := c.mod[id]; found {
				if m.Outcome == "" {
					continue
				}
				r = m
			}
			r.ID = id
			rep.Results = append(rep.Results, r)
		}
		res := Evaluate(plan, rep)
		var st []string
		for _, r := range res.Rows {
			st = append(st, string(r.Status))
		}
		if got := strings.Join(st, " "); got != c.statuses || res.Passed() != c.pass || res.ControlsOK != c.controls {
			t.Errorf("%s: statuses %q passed=%v controls=%v, want %q %v %v", c.name, got, res.Passed(), res.ControlsOK, c.statuses, c.pass, c.controls)
		}
	}
	var nilRes *Result
	if nilRes.Passed() || (&Result{}).Passed() {
		t.Error("an empty result passed")
	}
}

func TestNewPlan(t *testing.T) {
	base := goldenSpec()
	count := func(p *Plan, g Group) (n, controls int) {
		for _, c := range p.Checks {
			if c.Group == g {
				n++
				if c.Control {
					controls++
				}
			}
		}
		return
	}
	p, err := NewPlan(base, GuardPolicy())
	if err != nil {
		t.Fatal(err)
	}
	// 5 TCP ports x (gateway + 1 host address), 4 UDP ports on the host
	// address and 3 on the gateway (not DNS: the zone resolver)
	if n, _ := count(p, GroupControlPlane); n != 10+4+3 {
		t.Errorf("%d control-plane checks, want 17", n)
	}
	// each peer port on the other zone's guest and the LAN address
	if n, _ := count(p, GroupOtherZone); n != 1+len(DefaultPeerUDPPorts()) {
		t.Errorf("%d other-zone checks", n)
	}
	if n, _ := count(p, GroupLAN); n != 1+len(DefaultPeerUDPPorts()) {
		t.Errorf("%d LAN checks", n)
	}
	if n, _ := count(p, GroupMetadata); n != 4 { // 2 endpoints x (GET + PUT)
		t.Errorf("%d metadata checks, want 4", n)
	}
	if _, c := count(p, GroupInternet); c != 3 { // HTTP, HTTPS, the UDP canary
		t.Errorf("guard: %d internet controls, want 3", c)
	}
	for _, c := range p.Checks {
		if c.Target.Method == "PUT" && c.Target.Headers[TokenTTLHeader] == "" {
			t.Errorf("%s: token PUT without %s", c.Name, TokenTTLHeader)
		}
	}
	lp, err := NewPlan(base, LockdownPolicy())
	if err != nil {
		t.Fatal(err)
	}
	if _, c := count(lp, GroupInternet); c != 0 {
		t.Errorf("lockdown: %d internet controls, want 0", c)
	}
	if _, c := count(lp, GroupControl); c != 2 { // the resolver, the UDP self-check
		t.Errorf("lockdown: %d controls, want 2", c)
	}
	none := base
	none.UDPPorts, none.PeerUDPPorts = []Port{}, []Port{}
	np, err := NewPlan(none, GuardPolicy())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range np.Checks {
		if c.Target.Kind == probe.KindUDP {
			t.Errorf("UDP row %q with both UDP port lists empty", c.Name)
		}
	}
	defaults := base
	defaults.ControlPorts, defaults.Metadata, defaults.MetadataDNS = nil, nil, nil
	dp, err := NewPlan(defaults, LockdownPolicy())
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := count(dp, GroupMetadata); n != 2*len(DefaultMetadata())+len(DefaultMetadataDNS()) {
		t.Errorf("default metadata: %d checks", n)
	}

	bad := []struct {
		name string
		mod  func(*Spec, *Policy)
		err  string
	}{
		{"no gateway", func(s *Spec, _ *Policy) { s.Gateway = netip.Addr{} }, "gateway"},
		{"v6 gateway", func(s *Spec, _ *Policy) { s.Gateway = netip.MustParseAddr("fd00::1") }, "gateway"},
		{"gateway outside subnet", func(s *Spec, _ *Policy) { s.Subnet = netip.MustParsePrefix("10.9.0.0/24") }, "outside subnet"},
		{"no local name", func(s *Spec, _ *Policy) { s.LocalName = "" }, "local_name"},
		{"bad name", func(s *Spec, _ *Policy) { s.LocalName = "a b" }, "name"},
		{"port 0", func(s *Spec, _ *Policy) { s.ControlPorts = []Port{{0, "x"}} }, "port 0"},
		{"udp port 0", func(s *Spec, _ *Policy) { s.PeerUDPPorts = []Port{{0, "x"}} }, "udp port 0"},
		{"no public with internet expected", func(s *Spec, _ *Policy) { s.Public = nil }, "public"},
		{"bad policy", func(_ *Spec, p *Policy) { p.LAN = "maybe" }, "policy lan"},
		{"timeout", func(s *Spec, _ *Policy) { s.Timeout = -1 }, "timeout"},
	}
	for _, c := range bad {
		s, pol := goldenSpec(), GuardPolicy()
		c.mod(&s, &pol)
		if _, err := NewPlan(s, pol); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.err)
		}
	}
}
