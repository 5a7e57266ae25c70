package firewall

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Routed guest traffic into a zone (issue 34, review 2): a guest that
// routes through its gateway (the node) to addresses of its own zone's
// subnets, none of them a guest, makes the node create a neighbour entry
// for each. The kernel's IPv4 neighbour table is one for the whole host
// (gc_thresh3, 1024 by default, Proxmox does not raise it); past it no
// entry can be made and the forced collection evicts the management
// gateway's too, so the node's API goes dark for everyone.
//
// The inet forward hook cannot tell such a routed packet from a guest's
// frame to another guest that br_netfilter passes through it: both come in
// and go out of the zone bridge. The bridge's own input hook can: it sees
// only the frames the bridge hands up to the node (to the bridge's MAC, or
// flooded), never those it forwards between ports. So the layer-2 table
// marks what a guest port hands up (GuestUpMark, chain port_up), and the
// forward chain drops a marked packet leaving through anything but the
// management interfaces unless its destination is an address a guest
// holds (@guest_addrs4, from the port map). A zone's guests still reach
// each other at layer 2, and through the node between the vnets of one
// zone; its egress leaves through the management interfaces as before.
// The mark is cleared once forwarded or delivered (the input chain's first
// rule), so no later rule, and no socket, sees it.
//
// The node itself answers guests too: the zone's dnsmasq replies to
// addresses a DHCP request names (guestDHCPRules), and a route of the
// uplink without an address of the node on it is in @uplink_nets4 with
// the subnets of its addresses (classify.go), so neither reaches past the
// guests' addresses or the uplink's own ranges.
//
// What a guest can still make the node resolve is bounded by the guest
// addresses of the node (a zone whose subnet overlaps another's reaches
// those too), never by the size of its subnet.

// GuestUpMark is the packet mark bit the layer-2 table sets on frames a
// guest port hands up to the node. pve-firewall uses 0x80000000
// (PVE/Firewall.pm FWACCEPTMARK) and the egress proxy whole values around
// 0x70690000 on its own sockets; this bit is neither.
const GuestUpMark uint32 = 0x00100000

// Names of the set and chain of this part.
const (
	// SetGuestAddrs4 (inet) holds every IPv4 address of the port map.
	SetGuestAddrs4 = "guest_addrs4"
	// SetGuestSelf4 (inet) holds "a . a" and "0.0.0.0 . a" for each of
	// them: a guest's DHCP request may name (ciaddr) only its own source
	// address, or a guest's address when sent from 0.0.0.0 (the layer-2
	// table pins that one to the port's own).
	SetGuestSelf4 = "guest_self4"

	chainPortUp = "port_up"
)

// portUp is the layer-2 table's input chain: frames a guest port hands up
// to the node get GuestUpMark. Ports are matched as port_in matches them
// (the guest ports, and ports named like one the guard has not seen).
func portUp() *ChainSpec {
	set := fmt.Sprintf("counter meta mark set meta mark | %#x", GuestUpMark)
	rules := []*RuleSpec{rule("guest-up", "iifname @guest_ports "+set,
		meta(expr.MetaKeyIIFNAME), lookup(SetGuestPorts, false), markSet(GuestUpMark, true))}
	for _, p := range GuestPortPrefixes {
		rules = append(rules, rule("unseen-up-"+p, fmt.Sprintf("iifname %q iifname != @other_ports %s", p+"*", set),
			meta(expr.MetaKeyIIFNAME), cmpEq([]byte(p)), lookup(SetOtherPorts, true), markSet(GuestUpMark, true)))
	}
	return &ChainSpec{Name: chainPortUp, Hook: nftables.ChainHookInput, HookName: "input", Priority: -300, Rules: rules}
}

// markSet sets (on) or clears bit in the packet's mark: nft's "meta mark
// set meta mark | bit", (mark & ^bit) ^ bit, or "& ^bit".
func markSet(bit uint32, on bool) []expr.Any {
	xor := uint32(0)
	if on {
		xor = bit
	}
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, ^bit), Xor: binary.NativeEndian.AppendUint32(nil, xor)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1}}
}

// markHas matches packets whose mark has bit.
func markHas(bit uint32) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, bit), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}}}
}

// routedRules are the forward chain's rules for routed guest packets: the
// drop of those into a zone to no guest, then the clearing of the mark.
func routedRules() []*RuleSpec {
	return []*RuleSpec{
		rule("routed-to-no-guest", fmt.Sprintf("meta mark & %#x != 0 oifname != @mgmt ip daddr != @guest_addrs4 counter drop", GuestUpMark),
			markHas(GuestUpMark), meta(expr.MetaKeyOIFNAME), lookup(SetMgmt, true),
			nfproto(unix.NFPROTO_IPV4), ipDaddr(4), lookup(SetGuestAddrs4, true), drop()),
		clearUpMark("guest-up-clear"),
	}
}

// guestDHCPRules come first in guest_in (before its established rule: a
// renewal dnsmasq answered makes its 5-tuple established): a guest's
// request to the zone's DHCP server may not make the server answer an
// address of the guest's choosing, which the node would then resolve. The
// zone's dnsmasq answers a relayed request at its giaddr (port 67) and a
// request of a client without a source address at its ciaddr (dnsmasq
// dhcp.c dhcp_packet), from the node itself: the output path, where the
// forward chain's bound does not reach. A guest is never a relay agent
// (giaddr must be 0), and a ciaddr must be 0 or the request's own source
// address, which the layer-2 table pins to the port's (ip4-saddr), or,
// from 0.0.0.0 (a rebinding client on a packet socket: sd-dhcp-client,
// udhcpc), a guest's address that the layer-2 table's dhcp-ciaddr rule
// pinned to the port's own (a fragment from 0.0.0.0 never passes it, so
// no such request is reassembled unchecked). Naming another guest's
// address would make dnsmasq answer it out of the sender's bridge (the
// reply's interface is the request's, IP_PKTINFO), where the node
// resolves it (reviews 5, 6). The
// input hook sees the datagram reassembled (conntrack's defragmentation
// runs at -400), so no field can hide in a second fragment.
func guestDHCPRules() []*RuleSpec {
	bootp := func(off uint32) *expr.Payload { // a BOOTP field after the UDP header
		return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 8 + off, Len: 4}
	}
	toServer := []any{l4proto(unix.IPPROTO_UDP), dport(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(67)}}
	zero := &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}}
	return []*RuleSpec{
		rule("guest-dhcp-relay", "udp dport 67 @th,256,32 != 0 counter drop",
			append(toServer, bootp(24), zero, drop())...),
		rule("guest-dhcp-ciaddr", "udp dport 67 @th,160,32 != 0 ip saddr . @th,160,32 != @guest_self4 counter drop",
			append(toServer, bootp(12), zero, nfproto(unix.NFPROTO_IPV4),
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
				// the ciaddr into the 32-bit register after the source
				// (NFT_REG32_01): each part of a concatenation is 4 bytes
				&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseTransportHeader, Offset: 8 + 12, Len: 4},
				lookup(SetGuestSelf4, true), drop())...),
	}
}

// clearUpMark is the rule that takes GuestUpMark off a packet (the
// forward chain's last word on it, and the input chain's first).
func clearUpMark(comment string) *RuleSpec {
	return rule(comment, fmt.Sprintf("meta mark & %#x != 0 counter meta mark set meta mark & %#x", GuestUpMark, ^GuestUpMark),
		markHas(GuestUpMark), markSet(GuestUpMark, false))
}

// guestAddrs returns the sorted, distinct IPv4 addresses of ports.
func guestAddrs(ports []Port) []netip.Addr {
	var out []netip.Addr
	for _, p := range ports {
		out = append(out, p.IPv4...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// guestAddrMembers are the members of set for the guest address a: a, or
// for @guest_self4 "a . a" (a request from a) and "0.0.0.0 . a" (one from a
// client sending without its address, as sd-dhcp-client and udhcpc rebind;
// the layer-2 table's dhcp-ciaddr rule pins that ciaddr to the port's own).
func guestAddrMembers(set string, a netip.Addr) []member {
	k := a.As4()
	if set == SetGuestSelf4 {
		return []member{{key: append(k[:], k[:]...), text: a.String() + " . " + a.String()},
			{key: append([]byte{0, 0, 0, 0}, k[:]...), text: "0.0.0.0 . " + a.String()}}
	}
	return []member{{key: k[:], text: a.String()}}
}

// guestAddrSets are @guest_addrs4 and @guest_self4 holding the addresses
// of ports.
func guestAddrSets(ports []Port) []*SetSpec {
	out := []*SetSpec{{Name: SetGuestAddrs4, KeyType: nftables.TypeIPAddr},
		{Name: SetGuestSelf4, KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr), Concat: true}}
	for _, a := range guestAddrs(ports) {
		for _, s := range out {
			for _, m := range guestAddrMembers(s.Name, a) {
				s.Elements = append(s.Elements, nftables.SetElement{Key: m.key})
				s.Text = append(s.Text, m.text)
			}
		}
	}
	return out
}

// withGuestAddrs fills rs's guest address sets from ports (Render leaves
// them empty: the port map is the guard's run-time state).
func withGuestAddrs(rs *Ruleset, ports []Port) *Ruleset {
	for _, fill := range guestAddrSets(ports) {
		for i, s := range rs.Sets {
			if s.Name == fill.Name {
				rs.Sets[i] = fill
			}
		}
	}
	return rs
}

// guestAddrChanges queues the changes of the guest address sets between
// the port maps cur and next: an address stays while any port holds it.
func guestAddrChanges(cs *changes, cur, next []Port) {
	a, b := guestAddrs(cur), guestAddrs(next)
	for _, set := range []string{SetGuestAddrs4, SetGuestSelf4} {
		c := cs.of(false, set)
		for _, x := range b {
			if _, ok := slices.BinarySearchFunc(a, x, netip.Addr.Compare); !ok {
				c.add = append(c.add, guestAddrMembers(set, x)...)
			}
		}
		for _, x := range a {
			if _, ok := slices.BinarySearchFunc(b, x, netip.Addr.Compare); !ok {
				c.del = append(c.del, guestAddrMembers(set, x)...)
			}
		}
	}
}
