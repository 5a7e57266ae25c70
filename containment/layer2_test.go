package containment

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/containment/l2observe"
	"github.com/pve-inspect/pve-inspect/containment/probe"
)

func layer2Spec() Spec {
	return Spec{Gateway: netip.MustParseAddr("10.10.1.1"), Subnet: netip.MustParsePrefix("10.10.1.0/24"),
		ControlPorts: []Port{{22, "SSH"}}, Metadata: []netip.Addr{}, MetadataDNS: []netip.Addr{}, UDPPorts: []Port{}, PeerUDPPorts: []Port{},
		Public: []netip.Addr{netip.MustParseAddr("203.0.113.10")}, ExternalName: "example.test", LocalName: "vm.zone.test",
		Layer2: &Layer2Spec{Bridge: "vneta", GuestPorts: []string{"tap101i0", "fwpr101p0"}, GuestAddr: netip.MustParseAddr("10.10.1.100")}}
}

func TestNewPlanLayer2(t *testing.T) {
	p, err := NewPlan(layer2Spec(), GuardPolicy())
	if err != nil {
		t.Fatal(err)
	}
	if p.Layer2 == nil || p.Layer2.Bridge != "vneta" || !slices.Equal(p.Layer2.Exclude, []string{"tap101i0", "fwpr101p0"}) || p.Layer2.Gateway != netip.MustParseAddr("10.10.1.1") {
		t.Fatalf("watch %+v", p.Layer2)
	}
	nonces := map[string]bool{}
	var kinds []probe.Kind
	for _, c := range p.Checks {
		if !isLayer2(c) {
			continue
		}
		kinds = append(kinds, c.Target.Kind)
		if len(c.Target.Nonce) != 2*probe.NonceLen || nonces[c.Target.Nonce] {
			t.Errorf("%s: nonce %q not fresh", c.Name, c.Target.Nonce)
		}
		nonces[c.Target.Nonce] = true
		if want := c.Target.Kind == probe.KindL2Control; c.Control != want || (c.Expect == Reachable) != want {
			t.Errorf("%s: control=%v expect=%s", c.Name, c.Control, c.Expect)
		}
		switch c.Target.Kind {
		case probe.KindL2SpoofAddr:
			a := netip.MustParseAddr(c.Target.SrcAddr)
			if !netip.MustParsePrefix("10.10.1.0/24").Contains(a) || a == netip.MustParseAddr("10.10.1.1") || a == netip.MustParseAddr("10.10.1.100") ||
				a == netip.MustParseAddr("10.10.1.0") || a == netip.MustParseAddr("10.10.1.255") {
				t.Errorf("spoofed address %s", a)
			}
		case probe.KindL2SpoofMAC:
			m, err := net.ParseMAC(c.Target.SrcMAC)
			if err != nil || m[0]&3 != 2 {
				t.Errorf("spoofed MAC %q: want locally administered unicast", c.Target.SrcMAC)
			}
		}
	}
	if !slices.Equal(kinds, []probe.Kind{probe.KindL2Control, probe.KindL2SpoofAddr, probe.KindL2SpoofMAC, probe.KindL2GratuitousARP}) {
		t.Errorf("layer-2 kinds %v", kinds)
	}
	if open, err := NewPlan(layer2Spec(), OpenPolicy()); err != nil || open.Checks[len(open.Checks)-1].Expect != Reachable {
		t.Errorf("open policy: %v", err)
	}

	bad := []struct {
		name string
		mod  func(*Spec, *Policy)
		err  string
	}{
		{"policy without layer2", func(_ *Spec, p *Policy) { p.Layer2 = "" }, "layer2"},
		{"no bridge", func(s *Spec, _ *Policy) { s.Layer2.Bridge = "" }, "bridge"},
		{"long bridge", func(s *Spec, _ *Policy) { s.Layer2.Bridge = "abcdefghijklmnop" }, "bridge"},
		{"no subnet", func(s *Spec, _ *Policy) { s.Subnet = netip.Prefix{} }, "subnet"},
		{"tiny subnet", func(s *Spec, _ *Policy) { s.Subnet = netip.MustParsePrefix("10.10.1.0/30") }, "subnet"},
	}
	for _, c := range bad {
		spec, pol := layer2Spec(), GuardPolicy()
		c.mod(&spec, &pol)
		if _, err := NewPlan(spec, pol); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %v, want an error about %s", c.name, err, c.err)
		}
	}
}

func TestRandomHost(t *testing.T) {
	subnet := netip.MustParsePrefix("10.0.0.0/29") // hosts .1 to .6
	avoid := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"),
		netip.MustParseAddr("10.0.0.4"), netip.MustParseAddr("10.0.0.5")}
	for range 50 {
		a, err := randomHost(subnet, avoid...)
		if err != nil || a != netip.MustParseAddr("10.0.0.6") {
			t.Fatalf("randomHost: %s %v, want the one free host 10.0.0.6", a, err)
		}
	}
	if _, err := randomHost(subnet, append(avoid, netip.MustParseAddr("10.0.0.6"))...); err == nil {
		t.Error("full subnet: no error")
	}
}

// fakeObserver runs the work and answers with fixed sightings.
type fakeObserver struct {
	s       l2observe.Sightings
	err     error
	noStart bool // fail before the work, as a missing bridge does
	q       l2observe.Query
}

func (f *fakeObserver) Observe(ctx context.Context, q l2observe.Query, during func(context.Context) error) (l2observe.Sightings, error) {
	f.q = q
	if f.noStart {
		return l2observe.Sightings{}, f.err
	}
	if err := during(ctx); err != nil {
		return l2observe.Sightings{}, err
	}
	return f.s, f.err
}

func TestRunnerLayer2Rows(t *testing.T) {
	plan, err := NewPlan(layer2Spec(), GuardPolicy())
	if err != nil {
		t.Fatal(err)
	}
	// c1 resolver control, c2 ssh, c3 http, c4 https, c5 recursion, then
	// c6 raw control, c7 spoofed address, c8 spoofed MAC, c9 gratuitous ARP
	nonce := map[probe.Kind]string{}
	rep := probe.Report{Version: probe.Version, Facts: goodFacts}
	for _, c := range plan.Checks {
		r := probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeTimeout}
		switch {
		case c.Target.Kind == probe.KindDNS:
			r = probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeResponse, RCode: "NOERROR", Answers: 1}
		case c.Group == GroupInternet:
			r = probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeResponse, HTTPStatus: 200}
		case isLayer2(c):
			r = probe.Result{ID: c.Target.ID, Outcome: probe.OutcomeSent, Detail: "frames on eth0, 3 times"}
			nonce[c.Target.Kind] = c.Target.Nonce
		}
		rep.Results = append(rep.Results, r)
	}
	out, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "probe")
	if err := os.WriteFile(bin, []byte("not really"), 0o755); err != nil {
		t.Fatal(err)
	}
	seen := func(where map[probe.Kind][]string, claims ...l2observe.Claim) l2observe.Sightings {
		s := l2observe.Sightings{Bridge: "vneta", Ports: []string{"tap102i0"}, Nonces: map[string][]string{}, GatewayClaims: claims}
		for k, w := range where {
			s.Nonces[nonce[k]] = w
		}
		return s
	}
	guarded := map[probe.Kind][]string{probe.KindL2Control: {"tap102i0", "vneta"}}
	cases := []struct {
		name     string
		obs      Layer2Observer
		statuses string // rows c6..c9
		detail   string // in the spoofed address row
	}{
		{"guard holds", &fakeObserver{s: seen(guarded)}, "PASS PASS PASS PASS", "not seen by the node (vneta) nor on tap102i0"},
		{"spoofed address leaks", &fakeObserver{s: seen(map[probe.Kind][]string{probe.KindL2Control: {"vneta"}, probe.KindL2SpoofAddr: {"tap102i0"}})},
			"PASS FAIL PASS PASS", "seen on tap102i0 (vneta is the node)"},
		{"gratuitous ARP leaks", &fakeObserver{s: seen(guarded, l2observe.Claim{Iface: "vneta", MAC: "bc:24:11:00:01:01"})}, "PASS PASS PASS FAIL", "not seen"},
		{"control only at a sibling", &fakeObserver{s: seen(map[probe.Kind][]string{probe.KindL2Control: {"tap102i0"}})}, "FAIL UNPROVEN UNPROVEN UNPROVEN", "not seen"},
		{"watch failed", &fakeObserver{err: errors.New("watch on vneta dropped 3 frames")}, "FAIL FAIL FAIL FAIL", "dropped 3 frames"},
		{"bridge missing", &fakeObserver{err: errors.New("bridge vneta: not found"), noStart: true}, "FAIL FAIL FAIL FAIL", "bridge vneta: not found"},
		{"no observer", nil, "FAIL FAIL FAIL FAIL", "no layer-2 observer"},
	}
	for _, c := range cases {
		r := &Runner{ProbePath: bin, Observer: c.obs}
		res, err := r.Run(context.Background(), &scriptedGuest{stdout: out}, plan)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var st []string
		for _, row := range res.Rows[len(res.Rows)-4:] {
			st = append(st, string(row.Status))
		}
		addr := res.Rows[len(res.Rows)-3]
		if got := strings.Join(st, " "); got != c.statuses || !strings.Contains(addr.Detail, c.detail) {
			t.Errorf("%s: statuses %q, address row %q; want %q and %q", c.name, got, addr.Detail, c.statuses, c.detail)
		}
		if f, ok := c.obs.(*fakeObserver); ok {
			if f.q.Bridge != "vneta" || len(f.q.Nonces) != 4 || !slices.Equal(f.q.Exclude, []string{"tap101i0", "fwpr101p0"}) ||
				hex.EncodeToString(f.q.Nonces[0]) != nonce[probe.KindL2Control] {
				t.Errorf("%s: query %+v", c.name, f.q)
			}
		}
	}
}
