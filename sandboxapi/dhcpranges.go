package sandboxapi

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// validateDHCPRanges checks network n's (field f) dhcp_ranges and writes
// each address in its canonical form. Proxmox refuses a range whose start
// is above its end, an end outside the subnet and two ranges that overlap
// (pve-network SubnetPlugin.pm validate_dhcp_ranges); the daemon refuses
// too what no guest could use (the network, broadcast and gateway
// addresses: sandbox.FixedAddressRefusal), ranges on an "auto" CIDR (not
// known before the create) and on a network without DHCP, and more than
// apitype.MaxDHCPRanges.
func validateDHCPRanges(n *apitype.NetworkRequest, f string) *apitype.Problem {
	if len(n.DHCPRanges) == 0 {
		return nil
	}
	f += ".dhcp_ranges"
	switch {
	case len(n.DHCPRanges) > apitype.MaxDHCPRanges:
		return invalid(f, "%d ranges: at most %d", len(n.DHCPRanges), apitype.MaxDHCPRanges)
	case n.CIDR == "auto":
		return invalid(f, "network %q has cidr \"auto\": dhcp_ranges need a fixed cidr", n.Name)
	case n.DHCP != nil && !*n.DHCP:
		return invalid(f, "network %q has dhcp off: dhcp_ranges need dhcp on", n.Name)
	}
	p := netip.MustParsePrefix(n.CIDR)
	type span struct{ lo, hi netip.Addr }
	var seen []span
	for j := range n.DHCPRanges {
		r := &n.DHCPRanges[j]
		rf := fmt.Sprintf("%s[%d]", f, j)
		var ends [2]netip.Addr
		for k, e := range []struct{ name, val string }{{"start", r.Start}, {"end", r.End}} {
			a, err := netip.ParseAddr(e.val)
			if err != nil || !a.Is4() {
				return invalid(rf+"."+e.name, "%s %q: want an IPv4 address", e.name, e.val)
			}
			if why := sandbox.FixedAddressRefusal(p, a); why != "" {
				return invalid(rf+"."+e.name, "%s %s on network %q: %s", e.name, a, n.Name, why)
			}
			ends[k] = a
		}
		if ends[1].Less(ends[0]) {
			return invalid(rf, "start %s is above end %s", ends[0], ends[1])
		}
		for k, o := range seen {
			if !ends[1].Less(o.lo) && !o.hi.Less(ends[0]) {
				return invalid(rf, "%s-%s overlaps %s[%d] %s-%s", ends[0], ends[1], f, k, o.lo, o.hi)
			}
		}
		seen = append(seen, span{ends[0], ends[1]})
		r.Start, r.End = ends[0].String(), ends[1].String()
	}
	return nil
}

// checkRangeRoom refuses a network with dhcp_ranges that cannot hold an
// address for each NIC on it at once: Proxmox gives every NIC an address
// of the ranges when it is configured (Vnets.pm add_next_free_cidr), a NIC
// with a fixed address too (sandbox/fixed.go, step 2), the sandbox's VMs
// build side by side, and a fixed address inside a range is taken before
// (Ipams/PVEPlugin.pm add_range_next_freeip skips held addresses); out of
// addresses, the configure fails ("can't find any free ip"). Call it after
// the VMs are validated (their networks filled in).
//
// A network of dhcp off is a subnet without a dhcp-range: there each NIC
// takes the next free address of the whole prefix when configured
// (Subnets.pm add_next_free_ip -> PVEPlugin.pm add_next_freeip: from the
// network address plus one to NetAddr::IP's last, the broadcast address
// less one, the gateway held), a NIC with a fixed address too, whose
// fixed one is held besides: such a network with a fixed cidr is refused
// at its cidr when the prefix cannot hold them all (prefixRoom).
func checkRangeRoom(c *apitype.CreateRequest) *apitype.Problem {
	for i, n := range c.Networks {
		if n.DHCP != nil && !*n.DHCP {
			if pr := prefixRoom(c, i); pr != nil {
				return pr
			}
			continue
		}
		ranges, field, planned := n.DHCPRanges, fmt.Sprintf("networks[%d].dhcp_ranges", i), ""
		if len(ranges) == 0 {
			// the daemon's range of a fixed cidr (sandbox.PlanDHCPRange)
			// is as small on a small prefix: a /28's .2-.14
			p, err := netip.ParsePrefix(n.CIDR)
			if err != nil || !p.Addr().Is4() {
				continue // "auto": the daemon's prefix, sized by its plan
			}
			ranges = []apitype.DHCPRange{sandbox.PlanDHCPRange(p)}
			field = fmt.Sprintf("networks[%d].cidr", i)
			planned = fmt.Sprintf(" (the daemon's range %s-%s of cidr %s: give dhcp_ranges or a larger cidr)", ranges[0].Start, ranges[0].End, p)
		}
		nics, fixedIn := 0, 0
		for _, v := range c.VMs {
			nics += countOf(v.Networks, n.Name)
			for _, nic := range v.NICs {
				if a, err := netip.ParseAddr(nic.IPv4); err == nil && nic.Network == n.Name && inRanges(ranges, a) {
					fixedIn++
				}
			}
		}
		room := -int64(fixedIn)
		for _, r := range ranges {
			room += rangeSize(r)
		}
		if room < int64(nics) {
			return invalid(field,
				"network %q: its %d NICs each take an address of the ranges while configured (one with a fixed ipv4 too), and the ranges have %d addresses left for them (%d of theirs are fixed ones)%s",
				n.Name, nics, room, fixedIn, planned)
		}
	}
	return nil
}

// prefixRoom refuses network i of c, of dhcp off, when its fixed cidr
// cannot give each of its NICs an address while configured on top of
// the fixed addresses on it (checkRangeRoom).
func prefixRoom(c *apitype.CreateRequest, i int) *apitype.Problem {
	n := c.Networks[i]
	p, err := netip.ParsePrefix(n.CIDR)
	if err != nil || !p.Addr().Is4() {
		return nil // "auto": its prefix is the daemon's, picked at the create
	}
	nics, fixed := 0, 0
	for _, v := range c.VMs {
		nics += countOf(v.Networks, n.Name)
		for _, nic := range v.NICs {
			if nic.Network == n.Name && nic.IPv4 != "" {
				fixed++
			}
		}
	}
	// the network, gateway and broadcast addresses are no NIC's
	room := int64(1)<<(32-p.Bits()) - 3 - int64(fixed)
	if room < int64(nics) {
		return invalid(fmt.Sprintf("networks[%d].cidr", i),
			"network %q has dhcp off: its %d NICs each take an address of cidr %s while configured (one with a fixed ipv4 too), and it has %d addresses left for them (%d of its addresses are fixed ones)",
			n.Name, nics, p, room, fixed)
	}
	return nil
}

func countOf(names []string, name string) int {
	k := 0
	for _, s := range names {
		if s == name {
			k++
		}
	}
	return k
}

// inRanges reports whether a lies in one of rs (validated ranges).
func inRanges(rs []apitype.DHCPRange, a netip.Addr) bool {
	return slices.ContainsFunc(rs, func(r apitype.DHCPRange) bool {
		lo, hi := netip.MustParseAddr(r.Start), netip.MustParseAddr(r.End)
		return !a.Less(lo) && !hi.Less(a)
	})
}

// rangeSize is the number of addresses of validated range r.
func rangeSize(r apitype.DHCPRange) int64 {
	lo, hi := netip.MustParseAddr(r.Start).As4(), netip.MustParseAddr(r.End).As4()
	return int64(binary.BigEndian.Uint32(hi[:])) - int64(binary.BigEndian.Uint32(lo[:])) + 1
}
