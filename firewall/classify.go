package firewall

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// classifier reads the interface classification from netlink.
type classifier struct {
	h       *netlink.Handle
	ns      *netns.NsHandle // nil: the caller's namespace
	trusted []string

	// the netlink subscriptions (replaced in tests to inject failures)
	subscribeRoutes func(chan<- netlink.RouteUpdate, <-chan struct{}, netlink.RouteSubscribeOptions) error
	subscribeLinks  func(chan<- netlink.LinkUpdate, <-chan struct{}, netlink.LinkSubscribeOptions) error
}

func newClassifier(ns *netns.NsHandle, trusted []string) (*classifier, error) {
	var h *netlink.Handle
	var err error
	if ns != nil {
		h, err = netlink.NewHandleAt(*ns)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("open netlink handle: %w", err)
	}
	return &classifier{h: h, ns: ns, trusted: sortedUnique(trusted),
		subscribeRoutes: netlink.RouteSubscribeWithOptions, subscribeLinks: netlink.LinkSubscribeWithOptions}, nil
}

func (c *classifier) close() { c.h.Close() }

// isDefault reports whether r is a default route (0.0.0.0/0 or ::/0) that
// forwards somewhere (unicast).
func isDefault(r netlink.Route) bool {
	if r.Type != 0 && r.Type != unix.RTN_UNICAST {
		return false
	}
	if r.Dst == nil {
		return true
	}
	ones, _ := r.Dst.Mask.Size()
	return ones == 0
}

// classify lists links and main-table routes. Management interfaces are the
// ones a default route (or one of its multipath next hops) leaves through.
func (c *classifier) classify() (Classification, error) {
	links, err := c.h.LinkList()
	if err != nil {
		return Classification{}, fmt.Errorf("list links: %w", err)
	}
	names := map[int]string{}
	byIndex := map[int]netlink.Link{}
	cls := Classification{Trusted: slices.Clone(c.trusted)}
	for _, l := range links {
		a := l.Attrs()
		names[a.Index] = a.Name
		byIndex[a.Index] = l
		cls.Interfaces = append(cls.Interfaces, a.Name)
	}
	routes, err := c.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return Classification{}, fmt.Errorf("list routes: %w", err)
	}
	var mgmt []string
	mgmtIdx := map[int]bool{}
	add := func(idx int) {
		if n, ok := names[idx]; ok && idx > 0 {
			mgmt = append(mgmt, n)
			mgmtIdx[idx] = true
		}
	}
	for _, r := range routes {
		if !isDefault(r) {
			continue
		}
		add(r.LinkIndex)
		for _, nh := range r.MultiPath {
			add(nh.LinkIndex)
		}
	}
	cls.Management = sortedUnique(mgmt)
	cls.Interfaces = sortedUnique(cls.Interfaces)
	for _, l := range links {
		if m, ok := names[l.Attrs().MasterIndex]; ok && l.Attrs().MasterIndex > 0 {
			cls.Enslaved = append(cls.Enslaved, Enslaved{Port: l.Attrs().Name, Bridge: m})
		}
	}
	slices.SortFunc(cls.Enslaved, func(a, b Enslaved) int { return strings.Compare(a.Port, b.Port) })
	for idx := range mgmtIdx {
		addrs, err := c.h.AddrList(byIndex[idx], netlink.FAMILY_V4)
		if err != nil {
			return Classification{}, fmt.Errorf("list addresses of %s: %w", names[idx], err)
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP.To4())
			ones, _ := a.Mask.Size()
			if !ok || ones < 8 {
				continue
			}
			cls.UplinkNets = append(cls.UplinkNets, netip.PrefixFrom(ip, ones).Masked())
		}
	}
	slices.SortFunc(cls.UplinkNets, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	cls.UplinkNets = slices.Compact(cls.UplinkNets)
	return cls, nil
}

// watch calls changed after every route or link event, and after each
// (re)subscription so that nothing missed while unsubscribed is lost. It
// resubscribes after any subscription error or close, and returns when ctx
// is done.
func (c *classifier) watch(ctx context.Context, changed func(), onErr func(error)) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := c.subscribeOnce(ctx, changed)
		if ctx.Err() != nil {
			return
		}
		onErr(err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (c *classifier) subscribeOnce(ctx context.Context, changed func()) error {
	done := make(chan struct{})
	defer close(done)
	errc := make(chan error, 2)
	onErr := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	routes := make(chan netlink.RouteUpdate, 64)
	if err := c.subscribeRoutes(routes, done, netlink.RouteSubscribeOptions{Namespace: c.ns, ErrorCallback: onErr}); err != nil {
		return fmt.Errorf("subscribe to routes: %w", err)
	}
	links := make(chan netlink.LinkUpdate, 64)
	if err := c.subscribeLinks(links, done, netlink.LinkSubscribeOptions{Namespace: c.ns, ErrorCallback: onErr}); err != nil {
		return fmt.Errorf("subscribe to links: %w", err)
	}
	changed() // resync: events may have been missed before subscribing
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return fmt.Errorf("netlink subscription: %w", err)
		case _, ok := <-routes:
			if !ok {
				return fmt.Errorf("route subscription closed")
			}
			changed()
		case _, ok := <-links:
			if !ok {
				return fmt.Errorf("link subscription closed")
			}
			changed()
		}
	}
}

// Classify reads the current interface classification once (for plan).
func Classify(ctx context.Context, cfg Config, opts ...Option) (Classification, error) {
	if err := ctx.Err(); err != nil {
		return Classification{}, err
	}
	o := buildOptions(opts)
	c, err := newClassifier(o.ns, cfg.Trusted)
	if err != nil {
		return Classification{}, err
	}
	defer c.close()
	return c.classify()
}
