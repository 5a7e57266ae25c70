// Package hostnet lists the networks the host itself uses: the prefix of
// every interface address and the destination of every route in every
// routing table, except default routes. A sandbox network that overlaps
// one of them would give the host a second route to the same addresses
// (a sandbox on 192.168.1.0/24 while the node's LAN is 192.168.1.0/24), so
// the sandbox API refuses such networks at create.
package hostnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Lister reads the host's networks through one netlink handle.
type Lister struct {
	h *netlink.Handle
}

// New returns a Lister of the network namespace the process is in.
func New() *Lister { return &Lister{h: &netlink.Handle{}} }

// NewAt returns a Lister of the namespace h is bound to (tests).
func NewAt(h *netlink.Handle) *Lister { return &Lister{h: h} }

// Prefixes returns the host's networks, masked, sorted and without
// duplicates. Default routes (/0) are left out: they overlap everything.
func (l *Lister) Prefixes(_ context.Context) ([]netip.Prefix, error) {
	var out []netip.Prefix
	addrs, err := l.h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("host networks: list addresses: %w", err)
	}
	for _, a := range addrs {
		if p, ok := prefix(a.IPNet); ok {
			out = append(out, p)
		}
	}
	routes, err := l.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("host networks: list routes: %w", err)
	}
	for _, r := range routes {
		if r.Type == unix.RTN_MULTICAST {
			continue
		}
		if p, ok := prefix(r.Dst); ok {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out), nil
}

// prefix turns a netlink network into a masked prefix; default routes,
// IPv6 link-local and unparsable networks are skipped.
func prefix(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	p, err := a.Unmap().Prefix(ones)
	if err != nil || p.Bits() == 0 || p.Addr().IsLinkLocalUnicast() && p.Addr().Is6() {
		return netip.Prefix{}, false
	}
	return p, true
}

// HasAddress says whether the interface named link exists and carries
// addr (false, no error, when the interface does not exist). The daemon
// asks it of a vnet's bridge and its subnet's gateway (sandbox.Options
// GatewayUp): a network reload that made the bridge from a configuration
// holding the subnet put the gateway address on it.
func (l *Lister) HasAddress(_ context.Context, link string, addr netip.Addr) (bool, error) {
	lk, err := l.h.LinkByName(link)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return false, nil
		}
		return false, fmt.Errorf("interface %s: %w", link, err)
	}
	addrs, err := l.h.AddrList(lk, netlink.FAMILY_ALL)
	if err != nil {
		return false, fmt.Errorf("addresses of %s: %w", link, err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr.Unmap() {
			return true, nil
		}
	}
	return false, nil
}
