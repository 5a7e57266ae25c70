package firewall

import (
	"context"
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// TestFirewallBridgeNameIsNoVNet (review55b): a zone bridge the guard was
// not told about gets the node's default egress policy, and a name SDN
// accepts for a vnet (pve-sdn-vnet-id: a letter, then letters or digits,
// eight characters at most) is never taken for a guest NIC's firewall
// bridge, whose VMID has three digits at least (fwbr<vmid>i<n>, nine
// characters at least): fwbr1i0, fwbr99i0 and fwbr1i23 are vnets and keep
// the default; fwbr100i0 is a firewall bridge.
func TestFirewallBridgeNameIsNoVNet(t *testing.T) {
	for _, tc := range []struct {
		name string
		fwbr bool
	}{
		{"fwbr1i0", false},
		{"fwbr99i0", false},
		{"fwbr1i23", false},
		{"fwbr0i0", false},
		{"fwbr100i0", true},
		{"fwbr999999999i31", true},
		{"fwbr0100i0", false},
	} {
		if got := isFirewallBridge(tc.name); got != tc.fwbr {
			t.Errorf("isFirewallBridge(%q) = %v, want %v", tc.name, got, tc.fwbr)
		}
	}
	cfg := Config{Egress: EgressConfig{Default: ZoneEgress{Mode: EgressNone}}}
	cls := Classification{Interfaces: []string{"fwbr1i0", "fwbr99i0", "fwbr100i0"}}
	got := egressByInterface(cfg, cls)
	for _, n := range []string{"fwbr1i0", "fwbr99i0"} {
		if z, ok := got[n]; !ok || z.Mode != EgressNone {
			t.Errorf("vnet %s: egress %+v (%v), want the default none", n, z, ok)
		}
	}
	if z, ok := got["fwbr100i0"]; ok {
		t.Errorf("firewall bridge fwbr100i0 has egress %+v", z)
	}
}

// TestFirewallBridgeOwnStackRules (review55b): the forward chain drops
// what would be routed in from a firewall bridge (only fwbr to fwbr is a
// bridged pass), the input chain what would be taken in on one, before
// the guest input policy, and the arp table the node's ARP there.
func TestFirewallBridgeOwnStackRules(t *testing.T) {
	rs, err := Render(Config{DnsmasqUser: "65534"}, fixedClassification, Switches{})
	if err != nil {
		t.Fatal(err)
	}
	find := func(rules []*RuleSpec, comment string) int {
		return slices.IndexFunc(rules, func(r *RuleSpec) bool { return r.Comment == comment })
	}
	fwd := rs.chain("forward").Rules
	if i := find(fwd, "fwbr-routed"); i < 0 || fwd[i].Text != `iifname "fwbr*" oifname != "fwbr*" counter drop` || i > find(fwd, "cross-zone") {
		t.Errorf("forward: fwbr-routed at %d", i)
	}
	in := rs.chain("input").Rules
	if i := find(in, "fwbr-input"); i < 0 || in[i].Text != `iifname "fwbr*" counter drop` || i > find(in, "guest-input") {
		t.Errorf("input: fwbr-input at %d", i)
	}
	arp := RenderARP(fixedClassification)
	if find(arp.Chains[0].Rules, "fwbr-arp") < 0 {
		t.Error("arp table: no fwbr-arp")
	}
}

// TestFirewallBridgeRulesRepaired (review55b): verify finds the firewall
// bridge rules tampered with and the repair (what the periodic verify
// runs) restores them: fwbr-ct-zone
// setting zone 2 instead of 1 (not the zone SDN's rule sets, so with both
// the two passes would no longer agree), and
// fwbr-input and fwbr-routed deleted. The change goes through the
// owner's own connection (nothing else can change the table).
func TestFirewallBridgeRulesRepaired(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	g := startGuard(t, n, cfg)
	tab := &nftables.Table{Name: TableName, Family: family}
	g.mu.Lock()
	err := func() error {
		for _, ch := range []string{"prerouting", "forward", "input"} {
			rules, err := g.conn.GetRules(tab, &nftables.Chain{Name: ch, Table: tab})
			if err != nil {
				return err
			}
			for _, r := range rules {
				switch c := string(r.UserData); {
				case strings.Contains(c, "fwbr-ct-zone"):
					zone2 := slices.Clone(r.Exprs)
					for i, e := range zone2 {
						if im, ok := e.(*expr.Immediate); ok {
							zone2[i] = &expr.Immediate{Register: im.Register, Data: binary.NativeEndian.AppendUint16(nil, 2)}
						}
					}
					g.conn.ReplaceRule(&nftables.Rule{Table: tab, Chain: &nftables.Chain{Name: ch, Table: tab}, Handle: r.Handle, Exprs: zone2, UserData: r.UserData})
				case strings.Contains(c, "fwbr-input"), strings.Contains(c, "fwbr-routed"):
					if err := g.conn.DelRule(r); err != nil {
						return err
					}
				}
			}
		}
		return g.conn.Flush()
	}()
	g.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	restored := func(out string) bool {
		return strings.Contains(out, `iifname "fwbr*" counter packets 0 bytes 0 ct zone set 1 comment "fwbr-ct-zone"`) &&
			strings.Contains(out, `comment "fwbr-input"`) && strings.Contains(out, `comment "fwbr-routed"`) &&
			!strings.Contains(out, "ct zone set 2")
	}
	if out := listTable(t, n); restored(out) || !strings.Contains(out, "ct zone set 2") {
		t.Fatalf("not tampered with:\n%s", out)
	}
	if err := g.Verify(ctx); err == nil {
		t.Fatal("verify found no drift")
	} else {
		t.Logf("verify: %v", err)
	}
	if err := g.repair(ctx); err != nil {
		t.Fatal(err)
	}
	if out := listTable(t, n); !restored(out) {
		t.Errorf("not restored:\n%s", out)
	}
	if err := g.Verify(ctx); err != nil {
		t.Error(err)
	}
}
