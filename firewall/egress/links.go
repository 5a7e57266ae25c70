package egress

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// NetlinkLinks implements Links over netlink in one network namespace.
type NetlinkLinks struct {
	h *netlink.Handle
}

// NewNetlinkLinks opens a netlink handle in ns (netns.None(): the
// caller's namespace). Close releases it.
func NewNetlinkLinks(ns netns.NsHandle) (*NetlinkLinks, error) {
	var h *netlink.Handle
	var err error
	if ns == netns.None() {
		h, err = netlink.NewHandle()
	} else {
		h, err = netlink.NewHandleAt(ns)
	}
	if err != nil {
		return nil, fmt.Errorf("egress: netlink handle: %w", err)
	}
	return &NetlinkLinks{h: h}, nil
}

// Close releases the handle.
func (l *NetlinkLinks) Close() { l.h.Close() }

// ByIndex returns the name of interface index.
func (l *NetlinkLinks) ByIndex(index int) (string, error) {
	link, err := l.h.LinkByIndex(index)
	if err != nil {
		return "", fmt.Errorf("egress: link %d: %w", index, err)
	}
	return link.Attrs().Name, nil
}

// ByAddr returns the name of the interface holding a.
func (l *NetlinkLinks) ByAddr(a netip.Addr) (string, error) {
	addrs, err := l.h.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return "", fmt.Errorf("egress: list addresses: %w", err)
	}
	for _, ad := range addrs {
		if got, ok := netip.AddrFromSlice(ad.IP.To4()); ok && got == a {
			link, err := l.h.LinkByIndex(ad.LinkIndex)
			if err != nil {
				return "", fmt.Errorf("egress: link of %s: %w", a, err)
			}
			return link.Attrs().Name, nil
		}
	}
	return "", fmt.Errorf("egress: no interface holds %s", a)
}

// indexNames remembers the names of interface indexes for a second, so
// that the resolver's read loop names each query's interface (to take the
// owner's quota before anything else) without a netlink round trip per
// packet. The kernel allocates indexes cyclically, so an index does not
// name another interface within a second of its own going. Used by one
// goroutine (the read loop): no lock.
type indexNames struct {
	links Links
	now   func() time.Time
	m     map[int]indexName
}

type indexName struct {
	name string
	at   time.Time
}

// maxIndexNames bounds the names remembered (a node's guest interfaces).
const maxIndexNames = 4096

// indexNameTTL is how long a name is remembered.
const indexNameTTL = time.Second

func newIndexNames(l Links) *indexNames {
	return &indexNames{links: l, now: time.Now, m: map[int]indexName{}}
}

// byIndex returns the name of interface index.
func (c *indexNames) byIndex(index int) (string, error) {
	now := c.now()
	if n, ok := c.m[index]; ok && now.Sub(n.at) < indexNameTTL {
		return n.name, nil
	}
	name, err := c.links.ByIndex(index)
	if err != nil {
		delete(c.m, index)
		return "", err
	}
	if len(c.m) >= maxIndexNames {
		clear(c.m)
	}
	c.m[index] = indexName{name: name, at: now}
	return name, nil
}
