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

// FirewallBridgeCTZone is the conntrack zone of the firewall bridge pass:
// SDN's (CT --zone 1).
const FirewallBridgeCTZone uint16 = 1

// firewallBridgePrefix is the name prefix SDN's rule matches (fwbr+).
const firewallBridgePrefix = "fwbr"

// firewallBridgeRE is the name pve-common gives a firewall bridge
// ($compute_fwbr_names: fwbr<vmid>i<n>); no SDN vnet is named so (eight
// characters at most).
var firewallBridgeRE = regexp.MustCompile(`^fwbr[0-9]+i[0-9]+$`)

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
