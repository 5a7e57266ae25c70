package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/firewall"
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

// Holds reports whether interface index holds a: whether a's local route
// through it exists ("local A dev IFACE" in the local table, which the
// kernel adds with each address of an interface, one per interface when
// two hold it). One RTM_GETROUTE with RTM_F_FIB_MATCH and the output
// interface: the kernel answers the FIB entry or "no route to host".
func (l *NetlinkLinks) Holds(index int, a netip.Addr) (bool, error) {
	if !a.Is4() || index <= 0 {
		return false, nil
	}
	routes, err := l.h.RouteGetWithOptions(a.AsSlice(), &netlink.RouteGetOptions{FIBMatch: true, OifIndex: index})
	if errors.Is(err, unix.EHOSTUNREACH) || errors.Is(err, unix.ENETUNREACH) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("egress: local route of %s through %d: %w", a, index, err)
	}
	for _, r := range routes {
		if r.Type != unix.RTN_LOCAL || r.LinkIndex != index || r.Dst == nil {
			continue
		}
		ones, bits := r.Dst.Mask.Size()
		if got, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok && got == a && ones == 32 && bits == 32 {
			return true, nil
		}
	}
	return false, nil
}

// ByAddr returns the name of the interface holding a, from a dump of
// every IPv4 address of the namespace: time in proportion to the node's
// addresses (bench/connlookup), so a guest's connections are named by
// the kernel's ingress index instead (ConnInterface), and by this only
// where that index is not the guest interface's.
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

// indexNames remembers, for a second, the name of an interface index
// and the owner of its policy, so that the resolver's read loop names
// each query's owner (to take its share before anything else) without a
// netlink round trip and a look-up of the guard's interfaces per packet.
// The kernel allocates indexes cyclically, so an index does not name
// another interface within a second of its own going; an owner is looked
// up again at once when the registry's policies changed (Registry.Seq),
// so a claimed or deleted sandbox's queries never count against the old
// owner, and within a second when a zone the daemon did not create
// changed. The owner only decides whose share a query takes: what the
// query may ask is decided afresh for each (Resolver.answer). Used by one
// goroutine (the read loop): no lock.
type indexNames struct {
	links Links
	reg   *Registry
	now   func() time.Time
	m     map[int]indexName
}

type indexName struct {
	name, owner string
	open        bool // its policy's mode is open
	seq         uint64
	at          time.Time
}

// maxIndexNames bounds the names remembered (a node's guest interfaces).
const maxIndexNames = 4096

// indexNameTTL is how long a name is remembered.
const indexNameTTL = time.Second

func newIndexNames(l Links, reg *Registry) *indexNames {
	return &indexNames{links: l, reg: reg, now: time.Now, m: map[int]indexName{}}
}

// byIndex returns the name of interface index, the owner of its policy
// and whether that policy is open (ErrNotGuest for an interface that is
// no guest's).
func (c *indexNames) byIndex(index int) (name, owner string, open bool, err error) {
	now, seq := c.now(), c.reg.Seq()
	if n, ok := c.m[index]; ok && now.Sub(n.at) < indexNameTTL && n.seq == seq {
		return n.name, n.owner, n.open, nil
	}
	delete(c.m, index)
	if name, err = c.links.ByIndex(index); err != nil {
		return "", "", false, err
	}
	rules, owner, err := c.reg.For(name)
	if err != nil {
		return "", "", false, err
	}
	open = rules.Mode == firewall.EgressOpen
	if len(c.m) >= maxIndexNames {
		clear(c.m)
	}
	c.m[index] = indexName{name: name, owner: owner, open: open, seq: seq, at: now}
	return name, owner, open, nil
}
