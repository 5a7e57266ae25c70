package firewall

import (
	"slices"
	"testing"
)

// TestFirewallBridgeNoEgress: a guest NIC's firewall bridge
// (fwbr<vmid>i<n>) gets no egress policy of its own, whatever the node's
// default: its pass is checked again at the vnet, and a default of
// allowlist or none once redirected its DNS to an address fwbr does not
// have (dropped). A zone's bridge of a name alike (fwbr, fwbr1; no
// pve-common firewall bridge) and the firewall bridge's veth pair and tap
// still get the default as any other interface; a zone that names a
// bridge keeps its policy on it.
func TestFirewallBridgeNoEgress(t *testing.T) {
	for _, mode := range []EgressMode{EgressNone, EgressAllowlist, EgressOpen} {
		t.Run(string(mode), func(t *testing.T) {
			cfg := Config{
				ZoneEgress: map[string]ZoneEgress{"run:za": {Bridges: []string{"vnetA", "fwbr7i0"}, Mode: EgressAllowlist}},
				Egress:     EgressConfig{Default: ZoneEgress{Mode: mode}},
			}
			cls := Classification{Management: []string{"eth0"},
				Interfaces: []string{"eth0", "fwbr", "fwbr1", "fwbr101i0", "fwbr999999999i12", "fwbr7i0", "fwln101i0", "fwpr101p0", "lo", "tap101i0", "vnetA"}}
			got := egressByInterface(cfg, cls)
			for _, n := range []string{"fwbr101i0", "fwbr999999999i12"} {
				if z, ok := got[n]; ok {
					t.Errorf("firewall bridge %s has egress %+v", n, z)
				}
			}
			for _, n := range []string{"fwbr", "fwbr1", "fwln101i0", "fwpr101p0", "tap101i0"} {
				if z, ok := got[n]; !ok || z.Mode != mode {
					t.Errorf("%s: egress %+v (%v), want the default %s", n, z, ok, mode)
				}
			}
			for _, n := range []string{"vnetA", "fwbr7i0"} {
				if z := got[n]; z.Mode != EgressAllowlist {
					t.Errorf("zone bridge %s: egress %+v, want its zone's allowlist", n, z)
				}
			}
			rs, err := Render(cfg, cls, Switches{})
			if err != nil {
				t.Fatal(err)
			}
			for _, set := range []string{SetEgressDNS, SetEgressNone, SetEgressAllowlist} {
				if slices.Contains(rs.Set(set).Text, "fwbr101i0") {
					t.Errorf("@%s holds fwbr101i0: %v", set, rs.Set(set).Text)
				}
			}
		})
	}
}

// TestFirewallBridgeZoneRule: the prerouting chain, before conntrack
// (raw priority), puts every packet in on a bridge named fwbr* in
// conntrack zone 1, the zone SDN's rule (CT --zone 1) sets, as its first
// rule.
func TestFirewallBridgeZoneRule(t *testing.T) {
	rs, err := Render(Config{DnsmasqUser: "65534"}, fixedClassification, Switches{})
	if err != nil {
		t.Fatal(err)
	}
	pre := rs.chain("prerouting")
	if pre.Priority >= -200 {
		t.Fatalf("prerouting priority %d: not before conntrack (-200)", pre.Priority)
	}
	if r := pre.Rules[0]; r.Comment != "fwbr-ct-zone" || r.Text != `iifname "fwbr*" counter ct zone set 1` {
		t.Errorf("prerouting's first rule: %s %q", r.Comment, r.Text)
	}
	if FirewallBridgeCTZone != 1 {
		t.Errorf("zone %d, want SDN's 1", FirewallBridgeCTZone)
	}
}
