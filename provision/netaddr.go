package provision

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// PrimaryAddr is the machine's primary IPv4 address: the first global
// address of the interface that carries the default route.
type PrimaryAddr struct {
	Interface string
	Prefix    netip.Prefix
}

// AddrSource finds the primary address.
type AddrSource interface {
	PrimaryAddr(ctx context.Context) (PrimaryAddr, error)
}

// ErrNoDefaultRoute means no interface carries an IPv4 default route.
var ErrNoDefaultRoute = errors.New("no IPv4 default route")

// NetlinkAddrs reads the primary address over netlink (no text parsing).
type NetlinkAddrs struct{}

// PrimaryAddr implements AddrSource.
func (NetlinkAddrs) PrimaryAddr(context.Context) (PrimaryAddr, error) {
	routes, err := netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return PrimaryAddr{}, fmt.Errorf("list routes: %w", err)
	}
	best := -1
	var bestRoute netlink.Route
	for _, r := range routes {
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		idx := r.LinkIndex
		if idx == 0 && len(r.MultiPath) > 0 {
			idx = r.MultiPath[0].LinkIndex
		}
		if idx == 0 {
			continue
		}
		if best == -1 || r.Priority < best {
			best, bestRoute = r.Priority, r
			bestRoute.LinkIndex = idx
		}
	}
	if best == -1 {
		return PrimaryAddr{}, ErrNoDefaultRoute
	}
	link, err := netlink.LinkByIndex(bestRoute.LinkIndex)
	if err != nil {
		return PrimaryAddr{}, fmt.Errorf("default route link %d: %w", bestRoute.LinkIndex, err)
	}
	addrs, err := netlink.AddrList(link, unix.AF_INET)
	if err != nil {
		return PrimaryAddr{}, fmt.Errorf("addresses of %s: %w", link.Attrs().Name, err)
	}
	for _, a := range addrs {
		if a.Scope != unix.RT_SCOPE_UNIVERSE || a.IPNet == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		return PrimaryAddr{Interface: link.Attrs().Name, Prefix: netip.PrefixFrom(ip, ones)}, nil
	}
	return PrimaryAddr{}, fmt.Errorf("default route interface %s has no global IPv4 address", link.Attrs().Name)
}

// StaticAddr is an AddrSource with a fixed answer (tests, fixtures).
type StaticAddr PrimaryAddr

// PrimaryAddr implements AddrSource.
func (s StaticAddr) PrimaryAddr(context.Context) (PrimaryAddr, error) { return PrimaryAddr(s), nil }
