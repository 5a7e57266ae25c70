package firewall

import (
	"encoding/binary"
	"fmt"
	"regexp"

	"github.com/google/nftables/expr"
)

// Guests whose NIC has Proxmox's firewall on (firewall=1 under the
// iptables pve-firewall, or on an OVS bridge: pve-firewall
// src/PVE/Firewall/Helpers.pm needs_fwbr) are not on the zone bridge:
// pve-common's tap_plug (src/PVE/Network.pm, $create_firewall_bridge_linux)
// puts the tap on a bridge of its own, fwbr<vmid>i<n>, joined to the vnet
// by the veth pair fwln<vmid>i<n> / fwpr<vmid>p<n>, and pve-firewall sets
// net.bridge.bridge-nf-call-iptables=1 (enable_bridge_firewall). Such a
// guest's packets pass the IP hooks twice: bridged on fwbr (iif fwbr),
// then at the vnet (iif the vnet). Conntrack makes and confirms the entry
// in the first pass, where the nat prerouting hook finds no rule and binds
// nothing; the veth drops the packet's entry, so the second pass finds
// the entry again with its NAT done, and the egress redirects, keyed on
// the vnet, never run: the guest's DNS reached the zone's dnsmasq
// unchecked and its proxied HTTPS was dropped.
//
// Proxmox's SDN knows the double pass and puts the fwbr pass in conntrack
// zone 1 (src/PVE/Network/SDN/Zones/SimplePlugin.pm, EvpnPlugin.pm:
// "post-up iptables -t raw -I PREROUTING -i fwbr+ -j CT --zone 1"), but
// only on a vnet whose subnet has snat. The guard does the same, whatever
// SDN did: its prerouting chain (raw priority, before conntrack) sets zone
// FirewallBridgeCTZone on every packet in on a bridge named fwbr*, so the
// fwbr pass and the vnet pass are two entries and the vnet's gets its NAT.
// Both rules set the same zone, so they agree wherever both exist.
// pve-firewall and proxmox-firewall set no conntrack zone themselves.
//
// Nothing of the guard's policy is decided in the fwbr pass: the bridged
// forward there goes from fwbr to fwbr (no rule of the forward chain
// drops it but the IPv6 and fail-closed ones), and the firewall bridge
// is no egress interface (egressByInterface): the default policy once
// made the fwbr pass redirect DNS to fwbr's own address, which it has
// none of, so the packet was dropped. The zone's policy applies at the
// vnet pass as for any guest.
//
// Nor may the guest talk to fwbr itself instead of through it (review55b).
// fwbr has no address, but the node's stack answered an ARP request
// arriving on it for any of its addresses with fwbr's own MAC (arp_ignore
// 0), and the bridge hands the node's stack a frame to that MAC, and every
// Ethernet broadcast or multicast frame, on fwbr (net/bridge/br_input.c
// br_handle_frame_finish, local_rcv): routed with iif fwbr, an interface
// of no egress policy, a none zone's guest reached the internet (UDP out,
// masqueraded; the reply comes back in zone 0 and misses the zone-1
// entry), and a query to the gateway's port 53 the guest had asked the
// ordinary way (redirected at the vnet, so fwbr's zone-1 entry of the
// original tuple saw a reply) sent again in a broadcast frame was
// accepted as established on fwbr and answered by the zone's dnsmasq. No
// packet of a guest's has any business on fwbr's own stack: the node's
// ARP on a firewall bridge is dropped (fwbr-arp), and so is every packet
// the node would route in from one (fwbr-routed: the bridged pass goes
// from fwbr to fwbr) or take in on one (fwbr-input).

// FirewallBridgeCTZone is the conntrack zone of the firewall bridge pass:
// SDN's (CT --zone 1).
const FirewallBridgeCTZone uint16 = 1

// firewallBridgePrefix is the name prefix SDN's rule matches (fwbr+).
const firewallBridgePrefix = "fwbr"

// firewallBridgeRE is the name pve-common gives a firewall bridge
// ($compute_fwbr_names: fwbr<vmid>i<n>, a VMID of 100 to 999999999:
// pve-common src/PVE/JSONSchema.pm pve_verify_vmid), nine characters at
// least: no SDN vnet is named so (eight at most, pve-network
// src/PVE/Network/SDN/VnetPlugin.pm pve-sdn-vnet-id; fwbr1i0 is a valid
// vnet id and gets the default policy as any other).
var firewallBridgeRE = regexp.MustCompile(`^fwbr[1-9][0-9]{2,8}i[0-9]+$`)

// isFirewallBridge reports whether name is a guest NIC's firewall bridge.
func isFirewallBridge(name string) bool { return firewallBridgeRE.MatchString(name) }

// firewallBridgeZone is the prerouting rule that puts the firewall bridge
// pass in its own conntrack zone: iifname "fwbr*" ct zone set 1.
func firewallBridgeZone() *RuleSpec {
	return &RuleSpec{Comment: "fwbr-ct-zone",
		Text: fmt.Sprintf("iifname %q counter ct zone set %d", firewallBridgePrefix+"*", FirewallBridgeCTZone),
		Exprs: []expr.Any{meta(expr.MetaKeyIIFNAME), cmpEq([]byte(firewallBridgePrefix)), &expr.Counter{},
			&expr.Immediate{Register: 1, Data: binary.NativeEndian.AppendUint16(nil, FirewallBridgeCTZone)},
			&expr.Ct{Key: expr.CtKeyZONE, Register: 1, SourceRegister: true}}}
}

// firewallBridgeRouted is the forward rule that drops what the node would
// route in from a firewall bridge: only the bridged pass (fwbr to the same
// fwbr) is a guest's traffic there.
func firewallBridgeRouted() *RuleSpec {
	return rule("fwbr-routed", fmt.Sprintf("iifname %q oifname != %q counter drop", firewallBridgePrefix+"*", firewallBridgePrefix+"*"),
		meta(expr.MetaKeyIIFNAME), cmpEq([]byte(firewallBridgePrefix)),
		meta(expr.MetaKeyOIFNAME), &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(firewallBridgePrefix)}, drop())
}

// firewallBridgeInput is the input rule that drops what the node would
// take in on a firewall bridge (a frame to fwbr's MAC, or a broadcast's
// copy for fwbr's own stack): a guest reaches the node at its vnet.
func firewallBridgeInput() *RuleSpec {
	return rule("fwbr-input", fmt.Sprintf("iifname %q counter drop", firewallBridgePrefix+"*"),
		meta(expr.MetaKeyIIFNAME), cmpEq([]byte(firewallBridgePrefix)), drop())
}
