// Package lantargets finds, without configuration, the addresses on the
// operator's networks that the containment check probes from a guest: the
// node's default gateways (the LAN or VPC router), the node's neighbours
// on the interfaces that carry a default route (ARP and ND tables), and
// one representative address of each private block (10/8, 172.16/12,
// 192.168/16, 100.64/10: the block's usual router address). Every target is
// probed on a few TCP ports (Ports) and, by the plan, on a few UDP ports
// (containment.DefaultPeerUDPPorts); a guest must reach none of them.
package lantargets

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Ports are the TCP ports each discovered address is probed on: SSH and
// HTTP (the router's and the neighbours' admin side).
var Ports = []uint16{22, 80}

// privateBlocks and the address probed in each (the block's usual router
// address), unless it is the node's own or excluded.
var privateBlocks = []struct {
	block netip.Prefix
	rep   netip.Addr
}{
	{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParseAddr("10.0.0.1")},
	{netip.MustParsePrefix("172.16.0.0/12"), netip.MustParseAddr("172.16.0.1")},
	{netip.MustParsePrefix("192.168.0.0/16"), netip.MustParseAddr("192.168.1.1")},
	{netip.MustParsePrefix("100.64.0.0/10"), netip.MustParseAddr("100.64.0.1")},
}

// Links is the netlink view the discovery reads (a *netlink.Handle).
type Links interface {
	LinkList() ([]netlink.Link, error)
	RouteListFiltered(family int, filter *netlink.Route, mask uint64) ([]netlink.Route, error)
	NeighList(linkIndex, family int) ([]netlink.Neigh, error)
	AddrList(link netlink.Link, family int) ([]netlink.Addr, error)
}

// Target is one discovered address and why it is a target.
type Target struct {
	Addr   netip.Addr
	Reason string // "default gateway", "neighbour on eth0", "private block 10.0.0.0/8"
}

// Discover lists the targets, gateways first, without duplicates and
// without the node's own addresses or exclude (e.g. the zone subnets).
func Discover(h Links, exclude []netip.Prefix) ([]Target, error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	own := map[netip.Addr]bool{}
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			own[ip.Unmap()] = true
		}
	}
	var out []Target
	seen := map[netip.Addr]bool{}
	add := func(ip netip.Addr, reason string) {
		ip = ip.Unmap()
		if !ip.IsValid() || ip.IsLoopback() || ip.IsMulticast() || ip.IsUnspecified() || own[ip] || seen[ip] {
			return
		}
		if ip.IsLinkLocalUnicast() && ip.Is4() {
			return // 169.254/16: the metadata rows cover it
		}
		for _, p := range exclude {
			if p.Contains(ip) {
				return
			}
		}
		seen[ip] = true
		out = append(out, Target{Addr: ip, Reason: reason})
	}
	mgmt := map[int]bool{}
	for _, r := range routes {
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		hops := []*netlink.NexthopInfo{{LinkIndex: r.LinkIndex, Gw: r.Gw}}
		hops = append(hops, r.MultiPath...)
		for _, nh := range hops {
			if nh.LinkIndex > 0 {
				mgmt[nh.LinkIndex] = true
			}
			if gw, ok := netip.AddrFromSlice(nh.Gw); ok {
				add(gw, "default gateway")
			}
		}
	}
	idx := make([]int, 0, len(mgmt))
	for i := range mgmt {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	for _, i := range idx {
		neighs, err := h.NeighList(i, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("list neighbours of %s: %w", names[i], err)
		}
		for _, n := range neighs {
			if n.State&(netlink.NUD_FAILED|netlink.NUD_NOARP) != 0 {
				continue
			}
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				add(ip, "neighbour on "+names[i])
			}
		}
	}
	for _, b := range privateBlocks {
		add(b.rep, "private block "+b.block.String())
	}
	return out, nil
}

// AddrPorts is every target on every port of Ports.
func AddrPorts(ts []Target) []netip.AddrPort {
	var out []netip.AddrPort
	for _, t := range ts {
		for _, p := range Ports {
			out = append(out, netip.AddrPortFrom(t.Addr, p))
		}
	}
	return out
}
