package firewall

import (
	"fmt"

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

// chainARPIn is the arp table's one chain.
const chainARPIn = "arp_in"

// arpHookIn is NF_ARP_IN (0): the arp family numbers its hooks apart from
// the inet ones (NF_INET_LOCAL_IN is 1, NF_ARP_OUT there).
var arpHookIn = nftables.ChainHook(0)

// RenderARP builds the desired table arp pve-inspect: ARP arriving on a
// device named like a guest port (GuestPortPrefixes) is dropped.
func RenderARP() *Ruleset {
	rs := &Ruleset{Family: nftables.TableFamilyARP, norm: newExprCache()}
	c := &ChainSpec{Name: chainARPIn, Hook: &arpHookIn, HookName: "input", Priority: 0}
	for _, p := range GuestPortPrefixes {
		c.Rules = append(c.Rules, rule("guest-port-arp-"+p, fmt.Sprintf("iifname %q counter drop", p+"*"),
			meta(expr.MetaKeyIIFNAME), cmpEq([]byte(p)), drop()))
	}
	rs.Chains = []*ChainSpec{c}
	return rs
}
