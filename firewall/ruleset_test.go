package firewall

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func TestMergePrefixes(t *testing.T) {
	cases := []struct {
		in   []string
		want []string
	}{
		{[]string{"10.0.0.0/8"}, []string{"10.0.0.0/8"}},
		{[]string{"169.254.0.0/16", "169.254.169.254/32"}, []string{"169.254.0.0/16"}},
		{[]string{"10.0.0.0/9", "10.128.0.0/9"}, []string{"10.0.0.0/8"}},
		{[]string{"192.0.2.7/32", "192.0.2.9/32", "192.0.2.8/32"}, []string{"192.0.2.7-192.0.2.9"}},
		{[]string{"224.0.0.0/4", "240.0.0.0/4"}, []string{"224.0.0.0/3"}},
		{[]string{"fd00:ec2::254/128", "fe80::a9fe:a9fe/128"}, []string{"fd00:ec2::254", "fe80::a9fe:a9fe"}},
		{nil, nil},
	}
	for _, tc := range cases {
		var ps []netip.Prefix
		for _, s := range tc.in {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		var got []string
		for _, r := range mergePrefixes(ps) {
			got = append(got, rangeText(r))
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("merge %v = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestIntervalElementsTopOfSpace(t *testing.T) {
	els := intervalElements(mergePrefixes([]netip.Prefix{netip.MustParsePrefix("240.0.0.0/4")}))
	if len(els) != 1 || els[0].IntervalEnd {
		t.Fatalf("range reaching 255.255.255.255 must have no end element: %+v", els)
	}
	els = intervalElements(mergePrefixes([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}))
	if len(els) != 2 || !els[1].IntervalEnd || netip.AddrFrom4([4]byte(els[1].Key)) != netip.MustParseAddr("11.0.0.0") {
		t.Fatalf("10.0.0.0/8 elements: %+v", els)
	}
}

var fixedClassification = Classification{
	Management: []string{"eth0"},
	Trusted:    []string{"stor0"},
	Interfaces: []string{"eth0", "lo", "stor0", "vnetA", "vnetB"},
	UplinkNets: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
}

func TestRenderGolden(t *testing.T) {
	cfg := Config{
		Metadata4:     []netip.Prefix{netip.MustParsePrefix("192.0.0.192/32")},
		Private4Allow: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")},
		Trusted:       []string{"stor0"},
		Zones:         map[string][]string{"zone1": {"vnetA", "vnetA2"}},
		DnsmasqUser:   "65534",
	}
	rs, err := Render(cfg, fixedClassification, Switches{})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "render.txt", []byte(rs.String()))
}

func TestRenderSwitches(t *testing.T) {
	cfg := Config{DnsmasqUser: "65534"}
	for _, tc := range []struct {
		sw           Switches
		lock, closed int
	}{
		{Switches{}, 0, 0},
		{Switches{Lockdown: true}, 1, 0},
		{Switches{FailClosed: true}, 0, 2},
		{Switches{Lockdown: true, FailClosed: true}, 1, 2},
	} {
		rs, err := Render(cfg, fixedClassification, tc.sw)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(rs.Set(SetLockdown).Elements); got != tc.lock {
			t.Errorf("%+v: lockdown elements %d, want %d", tc.sw, got, tc.lock)
		}
		if got := len(rs.Set(SetFailClosed).Elements); got != tc.closed {
			t.Errorf("%+v: failclosed elements %d, want %d", tc.sw, got, tc.closed)
		}
		off, _ := Render(cfg, fixedClassification, Switches{})
		if rs.String() == off.String() && (tc.lock+tc.closed) > 0 {
			t.Errorf("%+v renders like off", tc.sw)
		}
		if rs.RuleCount() != off.RuleCount() {
			t.Errorf("%+v: switches change the rules (%d vs %d)", tc.sw, rs.RuleCount(), off.RuleCount())
		}
	}
}

func TestRenderMissingDnsmasqUser(t *testing.T) {
	rs, err := Render(Config{DnsmasqUser: "no-such-user-pve-inspect"}, fixedClassification, Switches{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Notes) != 1 || !strings.Contains(rs.Notes[0], "no-such-user-pve-inspect") {
		t.Errorf("notes = %v", rs.Notes)
	}
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			if c.Name == "output" && r.Comment == "dnsmasq-lockdown" {
				t.Errorf("output rule dnsmasq-lockdown rendered without a dnsmasq user")
			}
		}
	}
}

func TestRenderRejectsWrongFamily(t *testing.T) {
	for _, cfg := range []Config{
		{Metadata4: []netip.Prefix{netip.MustParsePrefix("fd00::/8")}},
		{Metadata6: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
		{Private4Allow: []netip.Prefix{netip.MustParsePrefix("fd00::/8")}},
	} {
		if _, err := Render(cfg, fixedClassification, Switches{}); err == nil {
			t.Errorf("Render(%+v) accepted a prefix of the wrong family", cfg)
		}
	}
}

func TestZonePeers(t *testing.T) {
	got := zonePeers(map[string][]string{"z": {"a", "b"}}, Classification{Trusted: []string{"s1", "s2"}, Interfaces: []string{"c"}})
	want := map[[2]string]bool{{"a", "a"}: true, {"a", "b"}: true, {"b", "a"}: true, {"b", "b"}: true,
		{"s1", "s1"}: true, {"s1", "s2"}: true, {"s2", "s1"}: true, {"s2", "s2"}: true, {"c", "c"}: true}
	if len(got) != len(want) {
		t.Fatalf("zonePeers = %v", got)
	}
	for _, p := range got {
		if !want[p] {
			t.Errorf("unexpected pair %v", p)
		}
	}
}

// TestRenderEgressGolden renders policies of every mode next to a
// non-open default: explicit zones keep theirs, every other guest
// interface gets the default, management, trusted and lo get nothing.
// The daemon's own open zone (run:) has its DNS to the zone's address
// redirected to the resolver (egress_dns_zone); a configured open zone
// does not.
func TestRenderEgressGolden(t *testing.T) {
	cfg := Config{
		Trusted: []string{"stor0"},
		Zones:   map[string][]string{"za": {"vnetA"}, "zb": {"vnetB"}, "zd": {"vnetD"}},
		ZoneEgress: map[string]ZoneEgress{
			"run:za": {Bridges: []string{"vnetA"}, Mode: EgressAllowlist, Allow: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/25"), netip.MustParsePrefix("198.51.100.7/32")},
				Deny: []netip.Prefix{netip.MustParsePrefix("203.0.113.5/32")}},
			"run:zb":    {Bridges: []string{"vnetB", "eth0"}, Mode: EgressOpen},
			"config:zd": {Bridges: []string{"vnetD"}, Mode: EgressOpen},
		},
		Egress:      EgressConfig{Default: ZoneEgress{Mode: EgressNone}, DNSPort: 5353, ProxyPort: 3129, Mark: 0x100},
		DnsmasqUser: "65534",
	}
	cls := fixedClassification
	cls.Interfaces = append(cls.Interfaces, "vnetC", "vnetD")
	rs, err := Render(cfg, cls, Switches{})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "render-egress.txt", []byte(rs.String()))
}

func TestRenderEgressRejectsBadPolicy(t *testing.T) {
	for _, cfg := range []Config{
		{Egress: EgressConfig{Default: ZoneEgress{Mode: "closed"}}},
		{ZoneEgress: map[string]ZoneEgress{"z": {Bridges: []string{"v"}, Mode: EgressAllowlist, Allow: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}}}},
		{ZoneEgress: map[string]ZoneEgress{"z": {Bridges: []string{"a-bridge-name-too-long"}, Mode: EgressNone}}},
		{Egress: EgressConfig{Default: ZoneEgress{Mode: EgressOpen, Deny: []netip.Prefix{{}}}}},
	} {
		if _, err := Render(cfg, fixedClassification, Switches{}); err == nil {
			t.Errorf("Render accepted egress %+v / %+v", cfg.Egress, cfg.ZoneEgress)
		}
	}
}

// TestEgressDropsCountOnJumpingRules: the drop metrics name the egress
// rules that jump to egress_drop, not egress_drop's own drop (which would
// count the same packets twice).
func TestEgressDropsCountOnJumpingRules(t *testing.T) {
	rs, err := Render(Config{DnsmasqUser: "65534"}, fixedClassification, Switches{})
	if err != nil {
		t.Fatal(err)
	}
	k := &kernelTable{rules: map[string][]*nftables.Rule{}}
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			k.rules[c.Name] = append(k.rules[c.Name], &nftables.Rule{Exprs: r.Exprs,
				UserData: userdata.AppendString(nil, userdata.TypeComment, r.Comment)})
		}
	}
	got, present, err := countersOf(k, rs)
	if err != nil || present != rs.RuleCount() {
		t.Fatalf("countersOf: %d of %d present, %v", present, rs.RuleCount(), err)
	}
	drop := map[string]bool{}
	for _, c := range got {
		drop[c.Chain+"/"+c.Rule] = c.Drop
	}
	// the allow-list's drops are counted where its chain jumps to
	// egress_drop (issue 24: forward/egress-allowlist jumps for every
	// packet of an allow-list zone, passed or not)
	for _, r := range []string{"forward/egress-none", "forward/egress-deny", "egress_allowlist_fwd/egress-allowlist-drop", "forward/private4"} {
		if !drop[r] {
			t.Errorf("%s is not a drop rule in the metrics", r)
		}
	}
	if v, ok := drop["forward/egress-allowlist"]; !ok || v {
		t.Errorf("forward/egress-allowlist: in metrics %v, drop %v; want present and not a drop rule", ok, v)
	}
	for _, r := range []string{"egress_drop/egress-denied-drop", "egress_drop/egress-denied-iface", "egress_drop/egress-denied-dest"} {
		if v, ok := drop[r]; !ok || v {
			t.Errorf("%s: in metrics %v, drop %v; want present and not a drop rule", r, ok, v)
		}
	}
}

func TestRenderFlood(t *testing.T) {
	cls := Classification{Management: []string{"eth0"}, Interfaces: []string{"eth0", "vnetA"}}
	for _, tc := range []struct {
		name  string
		flood FloodConfig
		want  []string // substrings of the rendering
		err   bool
	}{
		{"defaults", FloodConfig{}, []string{"elements = { 22, 8006 }", "ct count over 2048", "limit rate over 50000/second burst 10000 packets"}, false},
		{"configured", FloodConfig{ManagementPorts: []uint16{8443, 22, 8443}, ConnLimit: 7, PacketRate: 9, PacketBurst: 3},
			[]string{"elements = { 22, 8443 }", "ct count over 7 ", "limit rate over 9/second burst 3 packets"}, false},
		{"port zero", FloodConfig{ManagementPorts: []uint16{0}}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{DnsmasqUser: "65534", Flood: tc.flood}
			rs, err := Render(cfg, cls, Switches{})
			if tc.err {
				if err == nil {
					t.Fatal("rendered a management port 0")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(rs.String(), w) {
					t.Errorf("rendering lacks %q", w)
				}
			}
		})
	}
	br, err := RenderBridge(nil, cls, nil, FloodConfig{PortARPRate: 4, PortARPBurst: 8, PortBroadcastRate: 5, PortBroadcastBurst: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"limit rate over 4/second burst 8 packets", "limit rate over 5/second burst 10 packets"} {
		if !strings.Contains(br.String(), w) {
			t.Errorf("bridge rendering lacks %q", w)
		}
	}
}
