package egress

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/portmap"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestFirewallBridgeGuestOnBed: a guest whose NIC has Proxmox's firewall
// on (firewall=1 under the iptables pve-firewall) sits behind its own
// bridge fwbr<vmid>i0, joined to the vnet by a veth pair, and with
// bridge-nf-call-iptables=1 its packets pass the IPv4 hooks twice: bridged
// on fwbr, then at the vnet. Conntrack made and confirmed the entry in the
// first pass, where no NAT rule matched; the second finds it with its NAT
// done, so the guard's egress redirects (keyed on the vnet) never ran:
// such a guest's DNS went to the zone's dnsmasq unchecked (any name, in an
// allowlist and a none zone) and its proxied HTTPS timed out. Proxmox's
// SDN puts the fwbr pass in conntrack zone 1 only for vnets whose subnet
// has snat. Each case must give the firewall=1 guests their zone's policy
// as a plain guest gets it: with or without SDN's rule, and whatever the
// node's default policy (which the guard once gave the fwbr bridge itself,
// so that DNS was redirected to an address fwbr does not have: dropped).
func TestFirewallBridgeGuestOnBed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		firewall bool
		sdnRule  bool // SDN's "iptables -t raw -I PREROUTING -i fwbr+ -j CT --zone 1"
		def      Policy
	}{
		{name: "plain", def: Policy{Mode: "open"}},
		{name: "firewall", firewall: true, def: Policy{Mode: "open"}},
		{name: "firewall, SDN's zone rule", firewall: true, sdnRule: true, def: Policy{Mode: "open"}},
		{name: "firewall, default allowlist", firewall: true, def: Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}}},
		{name: "firewall, SDN's zone rule, default none", firewall: true, sdnRule: true, def: Policy{Mode: "none"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			s := newStackWith(t, ctx, tc.def, stackConfig{firewall: tc.firewall})
			if tc.sdnRule {
				s.addSDNZoneRule(t)
			}
			s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
			s.set(t, ctx, "zoneb", Policy{Mode: "none"})
			s.set(t, ctx, "zonec", Policy{Mode: "open"})
			s.conntrackAcct(t)
			elog := NewLog(LogConfig{PerOwner: 64})
			flows, _ := s.startFlows(t, ctx, elog, FlowConfig{})
			if tc.firewall {
				s.checkFirewallPorts(t)
			}
			s.checkEgressPolicies(t)
			s.checkOneFlowEach(t, elog, flows)
			if err := s.g.Verify(ctx); err != nil {
				t.Error(err)
			}
			if tc.firewall && !tc.sdnRule && tc.def.Mode == "open" {
				s.checkContainment(t, ctx)
			}
		})
	}
}

// addSDNZoneRule adds to the node what pve-network's SDN adds to a vnet
// whose subnet has snat (src/PVE/Network/SDN/Zones/SimplePlugin.pm:
// "post-up iptables -t raw -I PREROUTING -i fwbr+ -j CT --zone 1"), as a
// table of its own: ip sdn-fwbr, raw prerouting, iifname "fwbr*" ct zone
// set 1.
func (s *stack) addSDNZoneRule(t *testing.T) {
	t.Helper()
	node, err := netns.GetFromName(s.b.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(node)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	tab := c.AddTable(&nftables.Table{Name: "sdn-fwbr", Family: nftables.TableFamilyIPv4})
	ch := c.AddChain(&nftables.Chain{Name: "PREROUTING", Table: tab, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw})
	c.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte("fwbr")},
		&expr.Immediate{Register: 1, Data: binary.NativeEndian.AppendUint16(nil, 1)},
		&expr.Ct{Key: expr.CtKeyZONE, Register: 1, SourceRegister: true},
	}})
	if err := c.Flush(); err != nil {
		t.Fatalf("SDN's zone rule: %v", err)
	}
}

// checkFirewallPorts: the bed plugged each guest as pve-common does, its
// VM config says firewall=1 so the daemon's port map names the vnet's
// port fwpr<vmid>p0, and the layer-2 guard holds that port as a mapped
// guest port (no port of the node left unmapped).
func (s *stack) checkFirewallPorts(t *testing.T) {
	t.Helper()
	vms, bad, err := portmap.Paths{Root: s.b.NodeRoot()}.ReadVMs()
	if err != nil || len(bad) > 0 {
		t.Fatalf("port map of the bed's node root: %v, %v", bad, err)
	}
	var mapped []string
	for _, p := range portmap.Ports(vms, nil, time.Now(), nil) {
		mapped = append(mapped, p.Name)
	}
	guarded := s.g.BridgeDesired().Set(firewall.SetGuestPorts).Text
	for _, g := range s.guests {
		fwbr, fwln, fwpr := testvm.FirewallBridgeNames(g.VMID, 0)
		out, err := nsRun(s.b.NodeNS(), "ip", "-o", "link", "show", "master", g.VNet)
		if err != nil || !strings.Contains(out, fwpr+"@") || strings.Contains(out, fmt.Sprintf("tap%di0", g.VMID)) {
			t.Errorf("vnet %s's ports: %v\n%s", g.VNet, err, out)
		}
		out, err = nsRun(s.b.NodeNS(), "ip", "-o", "link", "show", "master", fwbr)
		if err != nil || !strings.Contains(out, fwln+"@") || !strings.Contains(out, fmt.Sprintf("tap%di0@", g.VMID)) {
			t.Errorf("%s's ports: %v\n%s", fwbr, err, out)
		}
		if !slices.Contains(mapped, fwpr) {
			t.Errorf("the port map of the bed's VM configs has no %s: %v", fwpr, mapped)
		}
		if !slices.Contains(guarded, `"`+fwpr+`"`) && !slices.Contains(guarded, fwpr) {
			t.Errorf("@guest_ports lacks %s: %v", fwpr, guarded)
		}
	}
	if u := s.g.UnmappedPorts(); len(u) > 0 {
		t.Errorf("unmapped guest ports: %v", u)
	}
}

// checkEgressPolicies: zonea (allowlist of the internet host's name),
// zoneb (none) and zonec (open) each hold, for their guest.
func (s *stack) checkEgressPolicies(t *testing.T) {
	t.Helper()
	inet, other := testvm.InternetAddr, "other."+testvm.InternetName
	gwa := s.gw["zonea"] + ":53"
	// allowlist: nothing open before a name was resolved
	if _, err := s.get("zonea", "http://"+inet+"/", inet+":80"); !isTimeout(err) {
		t.Errorf("allowlist, unresolved address: %v, want a timeout", err)
	}
	for _, tcp := range []bool{false, true} {
		if got, err := s.resolve("zonea", testvm.InternetName, gwa, tcp); err != nil || len(got) != 1 || got[0] != inet {
			t.Errorf("allowlist, allowed name via the zone resolver (tcp=%v): %v, %v", tcp, got, err)
		}
	}
	for _, server := range []string{gwa, inet + ":53"} {
		if got, err := s.resolve("zonea", other, server, false); err == nil || !strings.Contains(err.Error(), "NXDOMAIN") {
			t.Errorf("allowlist, denied name via %s: %v, %v; want NXDOMAIN (the daemon's resolver)", server, got, err)
		}
	}
	if body, err := s.get("zonea", "https://"+testvm.InternetName+"/", inet+":443"); err != nil || body != "internet host" {
		t.Errorf("allowlist, allowed name over the proxy: %q, %v", body, err)
	}
	if body, err := s.get("zonea", "https://"+other+"/", inet+":443"); err == nil {
		t.Errorf("allowlist, denied SNI on the allowed address: %q", body)
	}
	if err := s.dial("zonea", inet+":8443"); err == nil {
		t.Error("allowlist, tcp 8443 to the allowed address connected")
	}
	// a source address the guest does not hold: the layer-2 guard drops it
	if got, err := s.resolveFrom("zonea", netip.MustParseAddr("10.10.1.250"), testvm.InternetName, gwa); err == nil {
		t.Errorf("allowlist, spoofed source: resolved %v", got)
	}
	// none: nothing resolves, nothing connects
	for _, server := range []string{s.gw["zoneb"] + ":53", inet + ":53"} {
		if got, err := s.resolve("zoneb", testvm.InternetName, server, false); err == nil {
			t.Errorf("none: a name resolved via %s: %v", server, got)
		}
	}
	if _, err := s.get("zoneb", "http://"+inet+"/", inet+":80"); !isTimeout(err) {
		t.Errorf("none: %v, want a timeout", err)
	}
	// open: any name, any address
	if got, err := s.resolve("zonec", other, s.gw["zonec"]+":53", false); err != nil || len(got) != 1 {
		t.Errorf("open: resolve: %v, %v", got, err)
	}
	if body, err := s.get("zonec", "http://"+other+"/", inet+":80"); err != nil || body != "internet host" {
		t.Errorf("open: any name: %q, %v", body, err)
	}
}

// checkOneFlowEach: the open zone's flow to the internet host is in its
// sandbox's record once (the firewall bridge's pass makes a conntrack
// entry of its own when zoned), and the allowlist zone's proxied HTTPS is
// no flow (it is the proxy's conn record).
func (s *stack) checkOneFlowEach(t *testing.T, elog *Log, flows *Flows) {
	t.Helper()
	key := "tcp " + testvm.InternetAddr + ":80"
	var recs []Record
	for range 60 { // conntrack ends a flow when its entry expires
		recs = elog.Read("sb-zonec", LogQuery{Type: RecordFlow}).Records
		if len(recs) >= 1 && flows.Live() == 0 {
			break
		}
		time.Sleep(time.Second)
	}
	n := 0
	for _, r := range recs {
		if r.Proto+" "+r.Dest.String() == key {
			n++
			if r.Guest.VMID != s.guests["zonec"].VMID || r.BytesOut == 0 || r.BytesIn == 0 {
				t.Errorf("flow %s: %+v", key, r)
			}
		}
	}
	if n != 1 {
		t.Errorf("sb-zonec's record has %d flows %s, want 1: %+v (stats %+v)", n, key, recs, flows.Stats())
	}
	if recs := elog.Read("sb-zonea", LogQuery{Type: RecordFlow}).Records; len(recs) != 0 {
		t.Errorf("sb-zonea's record has flows (its HTTPS went through the proxy): %+v", recs)
	}
}

// checkContainment runs the containment check from the allowlist zone's
// guest over its agent: the guard's other walls (the node's services,
// metadata, another zone's guest) hold for it too.
func (s *stack) checkContainment(t *testing.T, ctx context.Context) {
	t.Helper()
	spec := s.allowlistSpec(t)
	spec.OtherZone = []netip.AddrPort{netip.AddrPortFrom(s.guests["zonec"].IPv4(), 22)} // nothing listens: refused = reachable
	if res := s.runAllowlistCheck(t, ctx, spec); !res.Passed() || !res.ControlsOK {
		t.Errorf("containment check from the firewall=1 guest: %d rows not passed", len(res.Failed()))
	}
}

// dial connects from zone's guest to addr (tcp), closing at once.
func (s *stack) dial(zone, addr string) error {
	return s.b.Do(s.guests[zone].NS, func() error {
		c, err := net.DialTimeout("tcp4", addr, 1500*time.Millisecond)
		if err == nil {
			_ = c.Close()
		}
		return err
	})
}

// resolveFrom asks server for name (A, udp) from zone's guest with src, an
// address the guest adds to its eth0 first.
func (s *stack) resolveFrom(zone string, src netip.Addr, name, server string) ([]string, error) {
	ns := s.guests[zone].NS
	if _, err := nsRun(ns, "ip", "addr", "add", src.String()+"/32", "dev", "eth0"); err != nil {
		return nil, err
	}
	var got []string
	err := s.b.Do(ns, func() error {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		c := &dns.Client{Timeout: 2 * time.Second, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: src.AsSlice()}}}
		resp, _, err := c.Exchange(m, server)
		if err != nil {
			return err
		}
		for _, rr := range resp.Answer {
			if a, ok := rr.(*dns.A); ok {
				got = append(got, a.A.String())
			}
		}
		return nil
	})
	return got, err
}

// nsRun runs a command in network namespace ns.
func nsRun(ns string, argv ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...).CombinedOutput()
	return string(out), err
}
