package firewall

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// classifier reads the interface classification from netlink and keeps
// it current from link and route events.
//
// Design decisions (issue 29: a node with thousands of bridges):
//   - The classification is a cache per link (name, master), refreshed by
//     that link's own events; nothing lists every link on an event. A
//     full listing happens only at (re)subscription and at the guard's
//     periodic verify, and corrects anything an event missed.
//   - Routes matter only as default routes (management) and as the
//     management links' addresses (uplink subnets); routes and those
//     addresses are listed again only on an event that can change them:
//     a default route, a route of a management link, a management link's
//     own link event.
//   - A full listing that the kernel reports interrupted (links changed
//     during the dump, NLM_F_DUMP_INTR) is retried, not failed: under a
//     burst of new bridges every dump of thousands of links is.
type classifier struct {
	ns      *netns.NsHandle // nil: the caller's namespace
	trusted []string

	// the netlink subscriptions (replaced in tests to inject failures)
	subscribeRoutes func(chan<- netlink.RouteUpdate, <-chan struct{}, netlink.RouteSubscribeOptions) error
	subscribeLinks  func(chan<- netlink.LinkUpdate, <-chan struct{}, netlink.LinkSubscribeOptions) error
	// relist fills the cache from a full listing after each subscription
	// (nil in tests of the subscription alone)
	relist func() error

	mu    sync.Mutex // guards h and the cache below
	h     *netlink.Handle
	links map[int]linkInfo // by index
	mgmt  []int            // indexes a default route leaves through
	cur   Classification   // kept sorted, built from the fields above
}

// linkInfo is what the classification needs of one link.
type linkInfo struct {
	name   string
	master int
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
	c := &classifier{h: h, ns: ns, trusted: sortedUnique(trusted), links: map[int]linkInfo{},
		subscribeRoutes: netlink.RouteSubscribeWithOptions, subscribeLinks: netlink.LinkSubscribeWithOptions}
	c.relist = func() error { _, err := c.classify(); return err }
	return c, nil
}

func (c *classifier) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.h.Close()
}

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

// dumpRetries bounds the retries of a listing the kernel reports
// interrupted; the last one's partial result is an error.
const dumpRetries = 20

// retryDump runs list until the kernel reports a consistent dump.
func retryDump(what string, list func() error) error {
	var err error
	for i := range dumpRetries {
		if err = list(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
		time.Sleep(time.Duration(i+1) * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", what, err)
	}
	return nil
}

// classify lists links, main-table routes and the management links'
// addresses, replaces the cache with them and returns the classification.
// Management interfaces are the ones a default route (or one of its
// multipath next hops) leaves through.
func (c *classifier) classify() (Classification, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var links []netlink.Link
	if err := retryDump("links", func() (err error) { links, err = c.h.LinkList(); return err }); err != nil {
		return Classification{}, err
	}
	m := make(map[int]linkInfo, len(links))
	for _, l := range links {
		a := l.Attrs()
		m[a.Index] = linkInfo{name: a.Name, master: a.MasterIndex}
	}
	mgmt, err := c.defaultLinksLocked(m)
	if err != nil {
		return Classification{}, err
	}
	c.links, c.mgmt = m, mgmt
	c.cur = Classification{Trusted: slices.Clone(c.trusted)}
	for _, l := range m {
		c.cur.Interfaces = append(c.cur.Interfaces, l.name)
		if p, ok := m[l.master]; ok && l.master > 0 {
			c.cur.Enslaved = append(c.cur.Enslaved, Enslaved{Port: l.name, Bridge: p.name})
		}
	}
	c.cur.Interfaces = sortedUnique(c.cur.Interfaces)
	slices.SortFunc(c.cur.Enslaved, func(a, b Enslaved) int { return strings.Compare(a.Port, b.Port) })
	if err := c.refreshMgmtLocked(); err != nil {
		return Classification{}, err
	}
	return c.cur.clone(), nil
}

// defaultLinksLocked lists the main table's routes and returns the
// indexes of the links default routes leave through.
func (c *classifier) defaultLinksLocked(links map[int]linkInfo) ([]int, error) {
	var routes []netlink.Route
	if err := retryDump("routes", func() (err error) {
		routes, err = c.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		return err
	}); err != nil {
		return nil, err
	}
	var out []int
	add := func(idx int) {
		if _, ok := links[idx]; ok && idx > 0 {
			out = append(out, idx)
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
	slices.Sort(out)
	return slices.Compact(out), nil
}

// refreshMgmtLocked sets Management and UplinkNets from c.mgmt: the
// management links' names, the IPv4 subnets of their addresses and their
// on-link (scope link) routes of the main table.
func (c *classifier) refreshMgmtLocked() error {
	var names []string
	var nets []netip.Prefix
	for _, idx := range c.mgmt {
		l, ok := c.links[idx]
		if !ok {
			continue
		}
		names = append(names, l.name)
		var addrs []netlink.Addr
		if err := retryDump("addresses of "+l.name, func() (err error) {
			addrs, err = c.h.AddrList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: idx}}, netlink.FAMILY_V4)
			return err
		}); err != nil {
			return err
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP.To4())
			ones, _ := a.Mask.Size()
			if !ok || ones < 8 {
				continue
			}
			nets = append(nets, netip.PrefixFrom(ip, ones).Masked())
		}
		// and its on-link routes (no gateway: the node resolves every
		// destination itself, whatever the route's scope) without an
		// address of the node in them: a provider's extra range, "ip
		// route add NET dev vmbr0 [scope global]", a dev-only nexthop
		// object (reviews 4, 5). A link without ARP (point-to-point:
		// wg, ppp, tun) resolves nothing; its routes stay open.
		nd, err := c.h.LinkByIndex(idx)
		if err != nil {
			return fmt.Errorf("link %s: %w", l.name, err)
		}
		if nd.Attrs().RawFlags&(unix.IFF_NOARP|unix.IFF_POINTOPOINT) != 0 {
			continue
		}
		var routes []netlink.Route
		if err := retryDump("routes of "+l.name, func() (err error) {
			routes, err = c.h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: idx, Table: unix.RT_TABLE_MAIN},
				netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
			return err
		}); err != nil {
			return err
		}
		for _, r := range routes {
			if !onLink(r) {
				continue
			}
			ip, ok := netip.AddrFromSlice(r.Dst.IP.To4())
			ones, _ := r.Dst.Mask.Size()
			if !ok || ones < 8 {
				continue
			}
			nets = append(nets, netip.PrefixFrom(ip, ones).Masked())
		}
	}
	slices.SortFunc(nets, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	c.cur.Management = sortedUnique(names)
	c.cur.UplinkNets = slices.Compact(nets)
	return nil
}

// onLink reports whether r is a unicast route to a network with no
// gateway on any next hop: one whose destinations the node resolves on
// the link itself.
func onLink(r netlink.Route) bool {
	if r.Dst == nil || r.Gw != nil || r.Via != nil || r.Type != unix.RTN_UNICAST {
		return false
	}
	for _, nh := range r.MultiPath {
		if nh.Gw != nil || nh.Via != nil {
			return false
		}
	}
	return true
}

// current returns the cached classification.
func (c *classifier) current() Classification {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur.clone()
}

// linkEvent applies one link's event to the cache. A management link's
// own event lists routes again (the kernel drops a link's IPv4 routes
// without an event when it goes down or away).
func (c *classifier) linkEvent(u netlink.LinkUpdate) error {
	if u.IfInfomsg.Family == unix.AF_BRIDGE {
		return nil // bridge port notifications; the link's own event follows
	}
	a := u.Link.Attrs()
	c.mu.Lock()
	defer c.mu.Unlock()
	old, had := c.links[a.Index]
	if had {
		c.cur.Interfaces = removeSorted(c.cur.Interfaces, old.name)
		c.dropEnslavedLocked(old.name)
	}
	deleted := u.Header.Type == unix.RTM_DELLINK
	if deleted {
		delete(c.links, a.Index)
	} else {
		l := linkInfo{name: a.Name, master: a.MasterIndex}
		c.links[a.Index] = l
		c.cur.Interfaces = insertSorted(c.cur.Interfaces, l.name)
		if m, ok := c.links[l.master]; ok && l.master > 0 {
			c.addEnslavedLocked(Enslaved{Port: l.name, Bridge: m.name})
		}
	}
	if had && (deleted || old.name != a.Name) {
		c.renameBridgeLocked(a.Index, old.name)
	}
	if slices.Contains(c.mgmt, a.Index) {
		return c.routesChangedLocked()
	}
	return nil
}

// renameBridgeLocked re-reads the ports of link idx (renamed or gone)
// after its old name oldName.
func (c *classifier) renameBridgeLocked(idx int, oldName string) {
	if !slices.ContainsFunc(c.cur.Enslaved, func(e Enslaved) bool { return e.Bridge == oldName }) {
		return
	}
	c.cur.Enslaved = slices.DeleteFunc(c.cur.Enslaved, func(e Enslaved) bool { return e.Bridge == oldName })
	if m, ok := c.links[idx]; ok {
		for _, l := range c.links {
			if l.master == idx {
				c.addEnslavedLocked(Enslaved{Port: l.name, Bridge: m.name})
			}
		}
	}
}

// routeEvent lists routes again when r can change the classification.
func (c *classifier) routeEvent(r netlink.Route) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !(r.Table == unix.RT_TABLE_MAIN && isDefault(r)) && !slices.Contains(c.mgmt, r.LinkIndex) {
		return nil
	}
	return c.routesChangedLocked()
}

func (c *classifier) routesChangedLocked() error {
	mgmt, err := c.defaultLinksLocked(c.links)
	if err != nil {
		return err
	}
	c.mgmt = mgmt
	return c.refreshMgmtLocked()
}

func (c *classifier) addEnslavedLocked(e Enslaved) {
	i, found := slices.BinarySearchFunc(c.cur.Enslaved, e.Port, func(x Enslaved, p string) int { return strings.Compare(x.Port, p) })
	if found {
		c.cur.Enslaved[i] = e
		return
	}
	c.cur.Enslaved = slices.Insert(c.cur.Enslaved, i, e)
}

func (c *classifier) dropEnslavedLocked(port string) {
	i, found := slices.BinarySearchFunc(c.cur.Enslaved, port, func(x Enslaved, p string) int { return strings.Compare(x.Port, p) })
	if found {
		c.cur.Enslaved = slices.Delete(c.cur.Enslaved, i, i+1)
	}
}

func insertSorted(s []string, v string) []string {
	i, found := slices.BinarySearch(s, v)
	if found {
		return s
	}
	return slices.Insert(s, i, v)
}

func removeSorted(s []string, v string) []string {
	i, found := slices.BinarySearch(s, v)
	if !found {
		return s
	}
	return slices.Delete(s, i, i+1)
}

// clone copies the classification's slices.
func (c Classification) clone() Classification {
	c.Management, c.Trusted, c.Interfaces = slices.Clone(c.Management), slices.Clone(c.Trusted), slices.Clone(c.Interfaces)
	c.UplinkNets, c.Enslaved = slices.Clone(c.UplinkNets), slices.Clone(c.Enslaved)
	return c
}

// subscribeBuffer is the socket receive buffer of each subscription: a
// burst of new bridges is thousands of messages, and an overflow
// (ENOBUFS) costs a resubscription and a full listing.
const subscribeBuffer = 8 << 20

// watch keeps the cache current from link and route events and calls
// changed after each event that was applied, and after each
// (re)subscription, which lists everything again so that nothing missed
// while unsubscribed is lost. It resubscribes after any subscription
// error or close (at once after a subscription that worked for a while,
// with a growing pause after quick failures) and returns when ctx is done.
func (c *classifier) watch(ctx context.Context, changed func(), onErr func(error)) {
	const minBackoff, maxBackoff = 10 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	for ctx.Err() == nil {
		began := time.Now()
		err := c.subscribeOnce(ctx, changed)
		if ctx.Err() != nil {
			return
		}
		onErr(err)
		if time.Since(began) > time.Second {
			backoff = minBackoff // it worked for a while: a fresh failure
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

func (c *classifier) subscribeOnce(ctx context.Context, changed func()) error {
	done := make(chan struct{})
	routes := make(chan netlink.RouteUpdate, 1024)
	links := make(chan netlink.LinkUpdate, 1024)
	defer func() {
		close(done)
		// the library's readers end when their socket closes; one that
		// is sending must not block forever
		go func() {
			for range routes {
			}
		}()
		go func() {
			for range links {
			}
		}()
	}()
	errc := make(chan error, 2)
	onErr := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	if err := c.subscribeRoutes(routes, done, netlink.RouteSubscribeOptions{Namespace: c.ns, ErrorCallback: onErr,
		ReceiveBufferSize: subscribeBuffer, ReceiveBufferForceSize: true}); err != nil {
		return fmt.Errorf("subscribe to routes: %w", err)
	}
	if err := c.subscribeLinks(links, done, netlink.LinkSubscribeOptions{Namespace: c.ns, ErrorCallback: onErr,
		ReceiveBufferSize: subscribeBuffer, ReceiveBufferForceSize: true}); err != nil {
		return fmt.Errorf("subscribe to links: %w", err)
	}
	// resync: events may have been missed before subscribing
	if c.relist != nil {
		if err := c.relist(); err != nil {
			return err
		}
	}
	changed()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return fmt.Errorf("netlink subscription: %w", err)
		case u, ok := <-routes:
			if !ok {
				return fmt.Errorf("route subscription closed")
			}
			if err := c.routeEvent(u.Route); err != nil {
				return err
			}
			changed()
		case u, ok := <-links:
			if !ok {
				return fmt.Errorf("link subscription closed")
			}
			if err := c.linkEvent(u); err != nil {
				return err
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
