package firewall

import (
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// The third table, arp pve-inspect (review 7): ARP the node's own stack
// receives on a guest's port device is dropped. A frame to a reserved
// link-local group (01:80:c2:00:00:0X) that the bridge does not forward
// skips the bridge's prerouting hook, so no layer-2 check sees it, and the
// bridge hands it to the stack on the port device itself
// (net/bridge/br_input.c br_handle_frame, RX_HANDLER_PASS; from memory).
// An ARP request there for an address of the node, or, on a node with
// arp_accept (FRR, EVPN anycast gateways), a gratuitous ARP or an
// unsolicited reply, made the node create a neighbour entry per forged
// sender (net/ipv4/arp.c arp_process), past the port's rp_filter too for
// the gratuitous ones. The arp family's input hook runs in arp_rcv with
// the device the frame arrived on: ARP a guest sends the ordinary way,
// bridged or handed up to the node, arrives on the bridge device, never on
// the port, so nothing a guest may do is dropped. The table has no sets;
// it is applied, verified and repaired with the other two.

// chainARPIn is the arp table's one chain; SetARPSpared its set.
const (
	chainARPIn   = "arp_in"
	SetARPSpared = "spared"
)

// arpHookIn is NF_ARP_IN (0): the arp family numbers its hooks apart from
// the inet ones (NF_INET_LOCAL_IN is 1, NF_ARP_OUT there).
var arpHookIn = nftables.ChainHook(0)

// RenderARP builds the desired table arp pve-inspect: ARP arriving on a
// device named like a guest port (GuestPortPrefixes) is dropped, unless the
// device is one of the node's management or trusted interfaces (@spared:
// a VPN's tap0 or a routed veth carrying the node's own traffic keeps its
// ARP; review 8). @spared follows the classification as a set, so the
// rules never change.
func RenderARP(cls Classification) *Ruleset {
	rs := &Ruleset{Family: nftables.TableFamilyARP, norm: newExprCache()}
	rs.Sets = []*SetSpec{ifNameSet(SetARPSpared, append(slices.Clone(cls.Management), cls.Trusted...))}
	c := &ChainSpec{Name: chainARPIn, Hook: &arpHookIn, HookName: "input", Priority: 0}
	c.Rules = append(c.Rules, rule("spared", "iifname @spared counter accept",
		meta(expr.MetaKeyIIFNAME), lookup(SetARPSpared, false), accept()))
	for _, p := range GuestPortPrefixes {
		c.Rules = append(c.Rules, rule("guest-port-arp-"+p, fmt.Sprintf("iifname %q counter drop", p+"*"),
			meta(expr.MetaKeyIIFNAME), cmpEq([]byte(p)), drop()))
	}
	// a firewall bridge has no address: the node answered ARP there with
	// fwbr's MAC (fwbridge.go)
	c.Rules = append(c.Rules, rule("fwbr-arp", fmt.Sprintf("iifname %q counter drop", firewallBridgePrefix+"*"),
		meta(expr.MetaKeyIIFNAME), cmpEq([]byte(firewallBridgePrefix)), drop()))
	rs.Chains = []*ChainSpec{c}
	return rs
}
