package firewall

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Names of the sets and chains of the layer-2 table bridge pve-inspect.
const (
	SetGuestPorts = "guest_ports"
	// SetOtherPorts are the ports named like guest ports that the guard
	// has seen on bridges of no zone (left alone).
	SetOtherPorts = "other_ports"
	SetPorts      = "ports"
	SetPortMAC    = "port_mac"
	SetPortIPv4   = "port_ip4"

	chainPortIn       = "port_in"
	chainPortGuard    = "port_guard"
	chainPortUnmapped = "port_unmapped"
	chainPortARP      = "port_arp"
)

// GuestPortPrefixes are the name prefixes of the bridge ports Proxmox
// creates for guests: tap<vmid>i<n> (QEMU NIC), veth<vmid>i<n> (container
// NIC) and fwpr<vmid>p<n> (the NIC's firewall bridge pair, when the
// Proxmox firewall is on for the NIC). Other ports of a zone bridge
// (uplinks of VLAN or VXLAN zones) are left alone.
var GuestPortPrefixes = []string{"tap", "veth", "fwpr"}

// Port is one guest NIC as the layer-2 table pins it.
type Port struct {
	// Name is the bridge port, e.g. tap101i0 (see PortNames).
	Name string
	// MAC is the NIC's address from the VM configuration.
	MAC net.HardwareAddr
	// IPv4 are the addresses the zone's DHCP/IPAM gave the NIC; empty
	// before a lease (the port is then DHCP-only).
	IPv4 []netip.Addr
}

var portNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)

// PortNames are the bridge port names of NIC netN of guest vmid: the tap
// device and, with the Proxmox firewall on the NIC, the fwpr veth that
// joins the firewall bridge to the zone bridge.
func PortNames(vmid, n int) []string {
	return []string{fmt.Sprintf("tap%di%d", vmid, n), fmt.Sprintf("fwpr%dp%d", vmid, n)}
}

// ContainerPortNames are the bridge port names of NIC netN of container
// vmid: its veth's host side (pve-container src/PVE/LXC.pm,
// "lxc.net.N.veth.pair = veth<vmid>i<N>") and, with the Proxmox firewall
// on the NIC, the fwpr veth, as for a VM (src/lxcnetaddbr plugs the veth
// with pve-common's tap_plug, which builds the same firewall bridge).
func ContainerPortNames(vmid, n int) []string {
	return []string{fmt.Sprintf("veth%di%d", vmid, n), fmt.Sprintf("fwpr%dp%d", vmid, n)}
}

// GuestPortNames are PortNames of a VM's NIC or, for a container,
// ContainerPortNames.
func GuestPortNames(container bool, vmid, n int) []string {
	if container {
		return ContainerPortNames(vmid, n)
	}
	return PortNames(vmid, n)
}

// validatePorts checks names, MACs and addresses; it returns the ports
// sorted by name, or an error naming the bad port.
func validatePorts(ports []Port) ([]Port, error) {
	out := make([]Port, 0, len(ports))
	seen := map[string]bool{}
	for _, p := range ports {
		if !portNameRE.MatchString(p.Name) {
			return nil, fmt.Errorf("port %q: bad interface name", p.Name)
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("port %s: listed twice", p.Name)
		}
		seen[p.Name] = true
		if len(p.MAC) != 6 || p.MAC[0]&1 != 0 || slices.Equal([]byte(p.MAC), make([]byte, 6)) {
			return nil, fmt.Errorf("port %s: MAC %q is not a unicast Ethernet address", p.Name, p.MAC)
		}
		cp := Port{Name: p.Name, MAC: slices.Clone(p.MAC)}
		for _, a := range p.IPv4 {
			if !a.Is4() || a.IsUnspecified() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
				return nil, fmt.Errorf("port %s: %s is not a unicast IPv4 address", p.Name, a)
			}
			cp.IPv4 = append(cp.IPv4, a)
		}
		slices.SortFunc(cp.IPv4, func(a, b netip.Addr) int { return a.Compare(b) })
		cp.IPv4 = slices.Compact(cp.IPv4)
		out = append(out, cp)
	}
	slices.SortFunc(out, func(a, b Port) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// RenderBridge builds the desired layer-2 table bridge pve-inspect. Its
// guest ports (@guest_ports) are the ports of the zone bridges
// (cls.Enslaved) named like a guest port (GuestPortPrefixes); ports may
// map NICs on any bridge (the map of a port that joins a zone bridge is
// then in force at once).
// Frames from a guest port must carry the port's MAC, IPv4 the port's
// assigned address, ARP claim only that address; DHCP server replies and
// router advertisements are dropped, and so is everything that is neither
// IPv4 nor ARP. A port without a mapping (not in ports) may only send DHCP
// requests. Each guest port's ARP and broadcast frames are policed (fc,
// zero values the defaults). It does not touch the kernel.
func RenderBridge(bridges []string, cls Classification, ports []Port, fc FloodConfig) (*Ruleset, error) {
	ports, err := validatePorts(ports)
	if err != nil {
		return nil, err
	}
	for _, b := range bridges {
		if !portNameRE.MatchString(b) {
			return nil, fmt.Errorf("zone bridge %q: bad interface name", b)
		}
	}
	rs := &Ruleset{Family: nftables.TableFamilyBridge, norm: newExprCache()}
	ifSet := func(name string, members []string) *SetSpec {
		s := &SetSpec{Name: name, KeyType: nftables.TypeIFName}
		for _, n := range sortedUnique(members) {
			s.Elements = append(s.Elements, nftables.SetElement{Key: ifname(n)})
			s.Text = append(s.Text, n)
		}
		return s
	}
	gp := ifSet(SetGuestPorts, zoneGuestPorts(bridges, cls))
	op := ifSet(SetOtherPorts, otherGuestPorts(bridges, cls))
	ps := &SetSpec{Name: SetPorts, KeyType: nftables.TypeIFName}
	pm := &SetSpec{Name: SetPortMAC, KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeEtherAddr), Concat: true}
	pi := &SetSpec{Name: SetPortIPv4, KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr), Concat: true}
	for _, p := range ports {
		ps.Elements = append(ps.Elements, nftables.SetElement{Key: ifname(p.Name)})
		ps.Text = append(ps.Text, p.Name)
		pm.Elements = append(pm.Elements, nftables.SetElement{Key: append(ifname(p.Name), append(slices.Clone([]byte(p.MAC)), 0, 0)...)})
		pm.Text = append(pm.Text, p.Name+" . "+p.MAC.String())
		for _, a := range p.IPv4 {
			b := a.As4()
			pi.Elements = append(pi.Elements, nftables.SetElement{Key: append(ifname(p.Name), b[:]...)})
			pi.Text = append(pi.Text, p.Name+" . "+a.String())
		}
	}
	rs.Sets = []*SetSpec{gp, op, ps, pm, pi}
	rs.Chains = []*ChainSpec{portIn(), portGuard(), portUnmapped(), portARP(), portUp()}
	addBridgeFlood(rs, fc)
	return rs, nil
}

// zoneGuestPorts are the ports of the zone bridges named like guest ports.
func zoneGuestPorts(bridges []string, cls Classification) []string {
	return guestPortsWhere(bridges, cls, true)
}

// otherGuestPorts are the ports named like guest ports on bridges of no
// zone.
func otherGuestPorts(bridges []string, cls Classification) []string {
	return guestPortsWhere(bridges, cls, false)
}

// guestPortsWhere are the ports named like guest ports on a zone bridge
// (inZone) or on a bridge of no zone (a set of the bridges, not a scan
// of them per port: thousands of each on a busy node).
func guestPortsWhere(bridges []string, cls Classification, inZone bool) []string {
	zone := make(map[string]bool, len(bridges))
	for _, b := range bridges {
		zone[b] = true
	}
	var out []string
	for _, e := range cls.Enslaved {
		if zone[e.Bridge] == inZone && isGuestPortName(e.Port) {
			out = append(out, e.Port)
		}
	}
	return out
}

func isGuestPortName(n string) bool {
	for _, p := range GuestPortPrefixes {
		if strings.HasPrefix(n, p) {
			return true
		}
	}
	return false
}

// portIn is the base chain: guest ports go to port_guard. It keys on the
// port name, not on "meta ibrname" (kernels without nft_meta_bridge lack
// it); @guest_ports follows link events. A port named like a guest port
// that the guard has not seen yet (a tap that joined while the daemon was
// down, or before its link event was handled) is in neither
// @guest_ports nor @other_ports and goes to port_guard too: unmapped, it
// may only ask for a lease (fail closed). Ports of other names (uplinks:
// physical NICs, bonds, VLAN and VXLAN devices) are never guarded, so a
// management bridge cannot lose its uplink to the guard.
func portIn() *ChainSpec {
	rules := []*RuleSpec{rule("guest-port", "iifname @guest_ports counter jump "+chainPortGuard,
		meta(expr.MetaKeyIIFNAME), lookup(SetGuestPorts, false), &expr.Counter{}, jump(chainPortGuard))}
	for _, p := range GuestPortPrefixes {
		rules = append(rules, rule("unseen-port-"+p, fmt.Sprintf("iifname %q iifname != @other_ports counter jump %s", p+"*", chainPortGuard),
			meta(expr.MetaKeyIIFNAME), cmpEq([]byte(p)), lookup(SetOtherPorts, true), &expr.Counter{}, jump(chainPortGuard)))
	}
	return &ChainSpec{Name: chainPortIn, Hook: nftables.ChainHookPrerouting, HookName: "prerouting", Priority: -300, Rules: rules}
}

// portGuard holds the checks every guest port gets.
func portGuard() *ChainSpec {
	return &ChainSpec{Name: chainPortGuard, Rules: []*RuleSpec{
		rule("dhcp-server", "ether type ip udp sport 67 counter drop",
			etherType(unix.ETH_P_IP), l4proto(unix.IPPROTO_UDP), sport(), cmpEq(be16(67)), drop()),
		rule("dhcp-to-client", "ether type ip udp dport 68 counter drop",
			etherType(unix.ETH_P_IP), l4proto(unix.IPPROTO_UDP), dport(), cmpEq(be16(68)), drop()),
		rule("router-advert", "ether type ip6 icmpv6 type nd-router-advert counter drop",
			etherType(unix.ETH_P_IPV6), l4proto(unix.IPPROTO_ICMPV6),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			cmpEq([]byte{134}), drop()),
		// a DHCP request's ciaddr is 0 or the port's own address: the
		// zone's dnsmasq answers it at ciaddr out of this bridge, and the
		// node resolves it there (routed.go)
		rule("dhcp-ciaddr", "ether type ip udp dport 67 @th,160,32 != 0 iifname . @th,160,32 != @port_ip4 counter drop",
			etherType(unix.ETH_P_IP), l4proto(unix.IPPROTO_UDP), dport(), cmpEq(be16(67)),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 8 + 12, Len: 4},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
			meta(expr.MetaKeyIIFNAME),
			&expr.Payload{DestRegister: 2, Base: expr.PayloadBaseTransportHeader, Offset: 8 + 12, Len: 4},
			lookup(SetPortIPv4, true), drop()),
		rule("unmapped", "iifname != @ports counter jump "+chainPortUnmapped,
			meta(expr.MetaKeyIIFNAME), lookup(SetPorts, true), &expr.Counter{}, jump(chainPortUnmapped)),
		rule("mac", "iifname . ether saddr != @port_mac counter drop",
			meta(expr.MetaKeyIIFNAME), llPayload(6, 6, 2), lookup(SetPortMAC, true), drop()),
		rule("arp", "ether type arp counter jump "+chainPortARP,
			etherType(unix.ETH_P_ARP), &expr.Counter{}, jump(chainPortARP)),
		dhcpClient(),
		rule("ip4-saddr", "ether type ip iifname . ip saddr != @port_ip4 counter drop",
			etherType(unix.ETH_P_IP), meta(expr.MetaKeyIIFNAME),
			&expr.Payload{DestRegister: 2, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			lookup(SetPortIPv4, true), drop()),
		// only an IPv4 header the kernel could parse: for one it could
		// not (a total length below the header or past the frame) the
		// bridge family sets no transport protocol, so the udp rules
		// above skip it; "meta l4proto" then ends this rule unmatched
		// (newer kernels) or reads 0 (older ones), and "other" drops it
		rule("ip4", "ether type ip meta l4proto != 0 counter accept", etherType(unix.ETH_P_IP),
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0}}, accept()),
		rule("other", "counter drop", drop()),
	}}
}

// portUnmapped: a port the daemon cannot map yet may only ask for a lease.
func portUnmapped() *ChainSpec {
	return &ChainSpec{Name: chainPortUnmapped, Rules: []*RuleSpec{
		dhcpClient(),
		rule("unmapped-drop", "counter drop", drop()),
	}}
}

// portARP: ARP from a guest must be Ethernet/IPv4 (htype 1, ptype ip,
// hlen 6, plen 4: the first 6 bytes of the ARP header) and claim the port's MAC
// and address (or 0.0.0.0: an RFC 5227 probe).
func portARP() *ChainSpec {
	return &ChainSpec{Name: chainPortARP, Rules: []*RuleSpec{
		rule("arp-shape", "ether type arp @nh,0,48 != 0x108000604 counter drop",
			etherType(unix.ETH_P_ARP), &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 0, Len: 6},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 1, 8, 0, 6, 4}}, drop()),
		rule("arp-mac", "ether type arp iifname . arp saddr ether != @port_mac counter drop",
			etherType(unix.ETH_P_ARP), meta(expr.MetaKeyIIFNAME),
			&expr.Payload{DestRegister: 2, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 6},
			lookup(SetPortMAC, true), drop()),
		rule("arp-probe", "ether type arp arp saddr ip 0.0.0.0 counter accept",
			etherType(unix.ETH_P_ARP), &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 14, Len: 4},
			cmpEq([]byte{0, 0, 0, 0}), accept()),
		rule("arp-ip", "ether type arp iifname . arp saddr ip != @port_ip4 counter drop",
			etherType(unix.ETH_P_ARP), meta(expr.MetaKeyIIFNAME),
			&expr.Payload{DestRegister: 2, Base: expr.PayloadBaseNetworkHeader, Offset: 14, Len: 4},
			lookup(SetPortIPv4, true), drop()),
		rule("arp-ok", "counter accept", accept()),
	}}
}

// dhcpClient accepts a DHCP request from a client without an address.
func dhcpClient() *RuleSpec {
	return rule("dhcp-client", "ether type ip ip saddr 0.0.0.0 udp sport 68 udp dport 67 counter accept",
		etherType(unix.ETH_P_IP),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		cmpEq([]byte{0, 0, 0, 0}),
		l4proto(unix.IPPROTO_UDP), sport(), cmpEq(be16(68)), dport(), cmpEq(be16(67)), accept())
}

func etherType(t uint16) []expr.Any {
	return []expr.Any{llPayload(12, 2, 1), cmpEq(be16(t))}
}

func llPayload(off, n, reg uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseLLHeader, Offset: off, Len: n}
}

func cmpEq(b []byte) *expr.Cmp { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b} }

func sport() expr.Any {
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2}
}

func jump(chain string) *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }
