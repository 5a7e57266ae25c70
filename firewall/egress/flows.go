package egress

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// DefaultMaxLiveFlows is the flows Flows follows from their start to
// their end at once when a config leaves it out.
const DefaultMaxLiveFlows = 65536

// FlowConfig configures a Flows.
type FlowConfig struct {
	// DNSPort and ProxyPort are the daemon's resolver and proxy ports: a
	// flow the guard redirected to one of them (destination NAT, the
	// reply from that port) is in the record already, as the resolver's
	// dns or the proxy's conn record, and is not recorded again.
	DNSPort, ProxyPort uint16
	// MaxLive bounds the flows followed at once (zero:
	// DefaultMaxLiveFlows); a flow starting past it is not recorded and
	// is counted (FlowStats.Untracked).
	MaxLive int
	// PerOwner bounds the flows followed at once of one owner's instance
	// (zero: MaxLive / DefaultOwners), so that one sandbox opening flows
	// without end cannot take the places of every other's; a flow of an
	// owner past it is not recorded and is counted
	// (FlowStats.OverShare). The daemon sets MaxLive / [egress] owners:
	// that many owners at their share fit.
	PerOwner int
	// NetNS is the node's network namespace whose conntrack is read
	// (netns.None(): the caller's).
	NetNS netns.NsHandle
	// ReadBuffer is the event socket's receive buffer in bytes (zero: 4
	// MiB): the queue between the kernel and Run, past which events are
	// lost and counted (FlowStats.Overruns).
	ReadBuffer int
}

// FlowOwners names the owner of a guest interface's policy and lets a
// ring be taken while that policy is current (*Registry).
type FlowOwners interface {
	ForGen(iface string) (Rules, string, uint64, error)
	IfCurrent(iface string, gen uint64, fn func()) bool
}

// NodeAddrs knows the node's own addresses and the interface whose
// on-link prefix holds an address (a zone's vnet bridge for a guest's).
type NodeAddrs interface {
	// BridgeOf returns the interface whose prefix holds a.
	BridgeOf(a netip.Addr) (string, bool)
	// IsLocal reports whether a is one of the node's own addresses.
	IsLocal(a netip.Addr) bool
}

// FlowStats counts what Flows did with the kernel's events.
type FlowStats struct {
	// Recorded flows (a record added to a live ring).
	Recorded uint64
	// Skipped events: not a guest's flow leaving its zone (another
	// protocol, to the node itself or its own zone, not from a guest
	// address), a redirect to the daemon's resolver or proxy, or the
	// firewall bridge pass's entry of a flow (conntrack zone
	// firewall.FirewallBridgeCTZone: its vnet pass's entry is recorded).
	Skipped uint64
	// Unattributed flows: from a guest address no zone's bridge or
	// owner could be found for.
	Unattributed uint64
	// Untracked flows: started while MaxLive were followed.
	Untracked uint64
	// OverShare flows: started while their owner had PerOwner followed.
	OverShare uint64
	// Unmatched ends: a flow whose start was not seen (begun before Run
	// listened and not in its dump, or its start event lost).
	Unmatched uint64
	// Lost flows: followed, then gone from the kernel's table without
	// their end event (lost to an overrun; found by a resync).
	Lost uint64
	// Overruns of the event socket (ENOBUFS: the kernel dropped events
	// the daemon did not read in time); each is followed by a resync.
	Overruns uint64
	// Bad messages the decoder refused.
	Bad uint64
}

// Flows records the flows the kernel's conntrack sees leave a sandbox's
// zone, in every egress mode: each as a RecordFlow in the owner's ring,
// with the bytes and packets conntrack counted each way
// (net.netfilter.nf_conntrack_acct, which the guard sets to 1 in the
// node's namespace). It listens to conntrack's NEW and DESTROY events:
// at NEW it finds the flow's owner (the guest's address by the guard's
// port map, the bridge whose prefix holds it, the owner of that bridge's
// policy) and takes the owner's ring while that policy is current; at
// DESTROY it adds the record to that ring, which records nothing once
// the owner's instance is gone (Log.Forget): a flow of a sandbox deleted
// or handed to a new tenant (a pool member claimed) before the flow ends
// is recorded nowhere. A flow conntrack confirmed is one the guard let
// out (the guard's drops are in the forward hook, before conntrack
// confirms an entry, and are the denials already, and KernelDrops'
// refused records); its verdict is VerdictAllowed.
//
// Handle is called by one goroutine (Run's); Stats and EndOf from any.
type Flows struct {
	cfg    FlowConfig
	owners FlowOwners
	log    *Log
	guests Guests
	addrs  NodeAddrs
	logger *slog.Logger
	now    func() time.Time

	// mu guards live, perRing, ended, synced, syncGen and swept: Handle
	// and Resync hold it (Run's goroutine), EndOf reads live under it.
	// Taken before the registry's and the Log's locks, never under them.
	mu   sync.Mutex
	live map[uint32]liveFlow // conntrack id -> the flow's start
	// perRing counts the followed flows of each ring (an owner's
	// instance), for FlowConfig.PerOwner; a ring with none has no key.
	perRing map[*Ring]int
	// ended holds a channel per ring an EndOf waits on, closed once the
	// ring has no flow followed.
	ended map[*Ring]chan struct{}
	// kill deletes flows' conntrack entries (EndOf; nil: conntrack's
	// delete in cfg.NetNS) and returns how many it deleted.
	kill  func([]conntrack.Flow) (int, error)
	ready chan struct{} // closed once Run first listens
	once  sync.Once
	// synced holds the ids of the table at the last Resync (nil before
	// the first) and syncGen the newest ring's Gen before it: a flow a
	// later Resync finds unfollowed is attributed only if it was not in
	// that table and its owner's ring is no newer (resync).
	synced  map[uint32]bool
	syncGen uint64
	// swept is the Log's forgets at the last sweep of the followed
	// flows of forgotten instances (begin, when MaxLive are followed).
	swept uint64

	recorded, skipped, unattributed, untracked, overShare, unmatched, lost, overruns, bad atomic.Uint64
}

// liveFlow is a followed flow: where its record goes and what of it was
// seen at its start.
type liveFlow struct {
	ring  *Ring
	guest Guest
	proto uint8
	dest  netip.AddrPort
	start time.Time
	// orig and zone find its conntrack entry (EndOf).
	orig conntrack.Tuple
	zone uint16
}

// NewFlows returns a recorder of the flows of owners' guests into log.
// guests names a guest by its address (the guard's port map: an address
// it pins to a VM's port), addrs the bridge whose prefix holds it.
func NewFlows(cfg FlowConfig, owners FlowOwners, log *Log, guests Guests, addrs NodeAddrs, logger *slog.Logger) *Flows {
	if cfg.MaxLive <= 0 {
		cfg.MaxLive = DefaultMaxLiveFlows
	}
	if cfg.PerOwner <= 0 {
		cfg.PerOwner = max(cfg.MaxLive/DefaultOwners, 1)
	}
	if cfg.ReadBuffer <= 0 {
		cfg.ReadBuffer = 4 << 20
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &Flows{cfg: cfg, owners: owners, log: log, guests: guests, addrs: addrs, logger: logger, now: time.Now,
		live: map[uint32]liveFlow{}, perRing: map[*Ring]int{}, ended: map[*Ring]chan struct{}{}, ready: make(chan struct{})}
}

// Ready is closed once Run first listens to the events (and has taken
// the table as it was then): every flow from then on is seen.
func (f *Flows) Ready() <-chan struct{} { return f.ready }

// Stats returns the counts so far.
func (f *Flows) Stats() FlowStats {
	return FlowStats{Recorded: f.recorded.Load(), Skipped: f.skipped.Load(), Unattributed: f.unattributed.Load(),
		Untracked: f.untracked.Load(), OverShare: f.overShare.Load(), Unmatched: f.unmatched.Load(), Lost: f.lost.Load(),
		Overruns: f.overruns.Load(), Bad: f.bad.Load()}
}

// Live returns the flows followed now.
func (f *Flows) Live() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

// Handle takes one conntrack event: a NEW starts following a guest's
// flow, a DESTROY records it. Other events are ignored.
func (f *Flows) Handle(ev conntrack.Event) {
	if ev.Flow == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch ev.Type {
	case conntrack.EventNew:
		f.begin(ev.Flow, f.now())
	case conntrack.EventDestroy:
		f.end(ev.Flow, f.now())
	}
}

// begin follows fl if it is a guest's flow leaving its zone.
func (f *Flows) begin(fl *conntrack.Flow, now time.Time) {
	lf, ok := f.classify(fl, now)
	if !ok {
		return
	}
	f.follow(fl.ID, lf)
}

// follow follows lf under id, unless its owner's instance has PerOwner
// flows followed, or MaxLive flows are followed and none of them is of a
// forgotten instance (sweepGone). A flow not followed is counted, and
// counted in its owner's record as a record dropped, so that the
// sandbox's reader knows its record misses flows.
func (f *Flows) follow(id uint32, lf liveFlow) {
	if _, had := f.live[id]; had {
		f.unfollow(id)
	}
	switch {
	case len(f.live) >= f.cfg.MaxLive && f.sweepGone() == 0:
		f.untracked.Add(1)
		lf.ring.dropOne()
		return
	case f.perRing[lf.ring] >= f.cfg.PerOwner:
		f.overShare.Add(1)
		lf.ring.dropOne()
		return
	}
	f.live[id] = lf
	f.perRing[lf.ring]++
}

// unfollow stops following the flow id (followed); an EndOf waiting for
// its ring's last flow is told.
func (f *Flows) unfollow(id uint32) {
	r := f.live[id].ring
	delete(f.live, id)
	if f.perRing[r]--; f.perRing[r] <= 0 {
		delete(f.perRing, r)
		if ch := f.ended[r]; ch != nil {
			close(ch)
			delete(f.ended, r)
		}
	}
}

// EndOf ends the flows of owner's instance still followed: their
// conntrack entries are deleted, and it waits, until ctx is done, for
// their DESTROY events (Run) to record them in its ring with conntrack's
// counts until then. It is for the delete that hands the owner's record
// over (Log.Take), once its guests are gone: a flow is recorded only at
// its end, and a flow still in conntrack then (a TCP flow in its
// TIME_WAIT, two minutes after its close; one its guest kept open, days)
// would end after the ring was taken and be recorded nowhere, so that a
// guest could keep what it sent out of the record handed over by not
// closing the connection. An error is the kernel's, or ctx done before
// every flow was recorded.
func (f *Flows) EndOf(ctx context.Context, owner string) error {
	r := f.log.current(owner)
	if r == nil {
		return nil
	}
	f.mu.Lock()
	var ends []conntrack.Flow
	for id, lf := range f.live {
		if lf.ring == r {
			ends = append(ends, conntrack.Flow{ID: id, TupleOrig: lf.orig, Zone: lf.zone})
		}
	}
	if len(ends) == 0 {
		f.mu.Unlock()
		return nil
	}
	done := f.ended[r]
	if done == nil {
		done = make(chan struct{})
		f.ended[r] = done
	}
	kill := f.kill
	f.mu.Unlock()
	if kill == nil {
		kill = f.deleteFlows
	}
	n, err := kill(ends)
	select {
	case <-done: // closed after the last one was recorded (end)
		return err
	case <-ctx.Done():
		f.mu.Lock()
		if f.ended[r] == done {
			delete(f.ended, r)
		}
		f.mu.Unlock()
		return errors.Join(err, fmt.Errorf("egress flows: %d of the %d flows of %s ended, not all recorded: %w", n, len(ends), owner, ctx.Err()))
	}
}

// deleteFlows deletes the conntrack entries of flows (their original
// tuple and zone) in cfg.NetNS; one already gone is not an error (it
// ended: its DESTROY event is on its way).
func (f *Flows) deleteFlows(flows []conntrack.Flow) (int, error) {
	c, err := conntrack.Dial(f.netlinkConfig())
	if err != nil {
		return 0, fmt.Errorf("egress flows: dial conntrack: %w", err)
	}
	defer c.Close()
	n := 0
	var errs []error
	for _, fl := range flows {
		if err := c.Delete(fl); err != nil {
			if !errors.Is(err, unix.ENOENT) {
				errs = append(errs, err)
			}
			continue
		}
		n++
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("egress flows: delete %d of %d conntrack entries: %w", len(errs), len(flows), errs[0])
	}
	return n, nil
}

// sweepGone stops following the flows whose ring's instance is forgotten
// (their end would be recorded nowhere): a deleted sandbox's open
// connections stay in conntrack for as long as its timeouts say (days
// for an established TCP one), and would otherwise hold their places
// among MaxLive until then, so that a tenant creating and deleting
// sandboxes could fill them and leave every sandbox's new flows
// unrecorded. It scans only when an instance was forgotten since its
// last scan, and returns the flows it let go (their ends are counted
// unmatched, as they would have recorded nothing).
func (f *Flows) sweepGone() int {
	l := f.log
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.forgets == f.swept {
		return 0
	}
	f.swept = l.forgets
	n := 0
	for id, lf := range f.live {
		if lf.ring.gone {
			f.unfollow(id)
			n++
		}
	}
	return n
}

// classify returns what is followed of fl, counting why when nothing is.
func (f *Flows) classify(fl *conntrack.Flow, now time.Time) (liveFlow, bool) {
	o := fl.TupleOrig
	src, dst := o.IP.SourceAddress, o.IP.DestinationAddress
	proto := o.Proto.Protocol
	switch {
	// the firewall bridge pass of a guest whose NIC has Proxmox's
	// firewall on: the same packets make the vnet pass's entry too
	// (zone 0, with the redirect's NAT), which is the one recorded
	case fl.Zone == firewall.FirewallBridgeCTZone,
		proto != unix.IPPROTO_TCP && proto != unix.IPPROTO_UDP,
		!src.Is4() || !dst.Is4(),
		!dst.IsGlobalUnicast(), // loopback, link-local, multicast, broadcast
		f.redirected(fl):
		f.skipped.Add(1)
		return liveFlow{}, false
	}
	g, ok := f.guests.GuestOf(src)
	if !ok {
		f.skipped.Add(1) // not a guest's address: the node's own, or a spoof the guard dropped
		return liveFlow{}, false
	}
	if f.addrs.IsLocal(dst) {
		f.skipped.Add(1) // to the node itself (the zone's dnsmasq): never left the zone
		return liveFlow{}, false
	}
	bridge, ok := f.addrs.BridgeOf(src)
	if !ok {
		f.unattributed.Add(1)
		return liveFlow{}, false
	}
	if b, ok := f.addrs.BridgeOf(dst); ok && f.sameZone(b, bridge) {
		f.skipped.Add(1) // within its own zone (its sandbox's networks)
		return liveFlow{}, false
	}
	ring := f.ringOf(bridge)
	if ring == nil {
		f.unattributed.Add(1)
		return liveFlow{}, false
	}
	start := now
	if !fl.Timestamp.Start.IsZero() {
		start = fl.Timestamp.Start
	}
	return liveFlow{ring: ring, guest: g, proto: proto, dest: netip.AddrPortFrom(dst, o.Proto.DestinationPort), start: start,
		orig: o, zone: fl.Zone}, true
}

// sameZone reports whether bridges a and b are one, or two bridges of one
// zone's policy (one owner: a sandbox's networks), between which a flow
// never leaves the zone.
func (f *Flows) sameZone(a, b string) bool {
	if a == b {
		return true
	}
	_, oa, _, errA := f.owners.ForGen(a)
	_, ob, _, errB := f.owners.ForGen(b)
	return errA == nil && errB == nil && oa == ob
}

// redirected reports whether fl is a guest's DNS or tcp 80/443 the
// guard redirected to the daemon's resolver or proxy (in the record as
// their dns and conn records).
func (f *Flows) redirected(fl *conntrack.Flow) bool {
	if !fl.Status.DstNAT() {
		return false
	}
	p := fl.TupleReply.Proto.SourcePort
	return p != 0 && (p == f.cfg.DNSPort || p == f.cfg.ProxyPort)
}

// ringOf returns the ring of the owner of bridge's policy, taken while
// that policy is current; nil when the bridge is no guest's.
func (f *Flows) ringOf(bridge string) *Ring {
	_, owner, gen, err := f.owners.ForGen(bridge)
	if err != nil {
		return nil
	}
	var ring *Ring
	f.owners.IfCurrent(bridge, gen, func() { ring = f.log.Open(owner) })
	return ring
}

// end records the followed flow fl ends.
func (f *Flows) end(fl *conntrack.Flow, now time.Time) {
	lf, ok := f.live[fl.ID]
	if !ok {
		f.unmatched.Add(1)
		return
	}
	o := fl.TupleOrig
	if o.IP.SourceAddress != lf.guest.Addr || o.Proto.Protocol != lf.proto ||
		netip.AddrPortFrom(o.IP.DestinationAddress, o.Proto.DestinationPort) != lf.dest {
		f.unmatched.Add(1) // not the flow begun under this id
		return
	}
	f.ring(lf, fl, now)
	f.unfollow(fl.ID) // recorded first: an EndOf waits for this
}

// ring adds the record of lf, ended as fl, to its ring.
func (f *Flows) ring(lf liveFlow, fl *conntrack.Flow, now time.Time) {
	end := now
	if !fl.Timestamp.Stop.IsZero() {
		end = fl.Timestamp.Stop
	}
	rec := Record{Time: lf.start.UTC(), Type: RecordFlow, Guest: lf.guest, Verdict: VerdictAllowed,
		Proto: protoName(lf.proto), Dest: lf.dest, Duration: max(end.Sub(lf.start), 0),
		BytesOut: clampInt64(fl.CountersOrig.Bytes), BytesIn: clampInt64(fl.CountersReply.Bytes),
		PacketsOut: clampInt64(fl.CountersOrig.Packets), PacketsIn: clampInt64(fl.CountersReply.Packets)}
	if lf.ring.AddFlow(rec) {
		f.recorded.Add(1)
	}
}

func protoName(p uint8) string {
	if p == unix.IPPROTO_UDP {
		return "udp"
	}
	return "tcp"
}

func clampInt64(v uint64) int64 { return int64(min(v, 1<<63-1)) }

// Resync makes the followed flows those of table (a dump of the kernel's
// conntrack table): a followed flow no longer in it ended unseen and is
// counted lost; a flow in it not followed yet is followed from now (its
// start time the kernel's, when nf_conntrack_timestamp is on).
func (f *Flows) Resync(table []conntrack.Flow) { f.resync(table, f.log.lastGen()) }

// resync is Resync with gen the newest ring's Gen before table was
// dumped. The first resync (the table as Run first found it) follows
// every guest flow in it. A later one (after an overrun or a new socket)
// follows a flow it finds unfollowed only when that flow was not in the
// previous table and its owner's ring is no newer than gen of that
// previous resync: then the flow began after that table was taken, while
// the ring's instance was current throughout, so it is that instance's.
// Any other such flow (in the previous table but not followed then: its
// start unseen, lost to an overrun, or past MaxLive) may be an earlier
// instance's, of a sandbox since deleted whose address a later sandbox
// holds now, and is not attributed (counted).
func (f *Flows) resync(table []conntrack.Flow, gen uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	first, prev, prevGen := f.synced == nil, f.synced, f.syncGen
	in := make(map[uint32]bool, len(table))
	for i := range table {
		in[table[i].ID] = true
	}
	for id := range f.live {
		if !in[id] {
			f.unfollow(id)
			f.lost.Add(1)
		}
	}
	for i := range table {
		id := table[i].ID
		if _, ok := f.live[id]; ok {
			continue
		}
		if first {
			f.begin(&table[i], now)
			continue
		}
		if prev[id] {
			continue // counted when that table was taken
		}
		lf, ok := f.classify(&table[i], now)
		if !ok {
			continue
		}
		if lf.ring.gen > prevGen {
			f.unattributed.Add(1) // its instance may be newer than the flow
			continue
		}
		f.follow(id, lf)
	}
	f.synced, f.syncGen = in, gen
}

// resyncEvery is the least time between two resyncs after overruns (a
// dump of the whole table).
const resyncEvery = 10 * time.Second

// Run listens to the node's conntrack events until ctx is done, and
// opens the socket again after an error (a second later, doubling to a
// minute while it keeps failing). An overrun
// (ENOBUFS) is counted, not fatal: the followed flows are made those of
// a dump of the table again, at most every ten seconds.
func (f *Flows) Run(ctx context.Context) error {
	delay := time.Second
	for {
		began := time.Now()
		err := f.listen(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(began) > time.Minute {
			delay = time.Second // it ran a while: a new failure
		}
		f.logger.Warn("egress flows: conntrack events", "component", "egress", "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Minute)
	}
}

// netlinkConfig is the netlink config of the node's namespace.
func (f *Flows) netlinkConfig() *netlink.Config {
	if f.cfg.NetNS == netns.None() {
		return &netlink.Config{}
	}
	return &netlink.Config{NetNS: int(f.cfg.NetNS)}
}

// listen subscribes to NEW and DESTROY events, takes the table as it is
// (Resync), and handles events until an error or ctx is done.
func (f *Flows) listen(ctx context.Context) error {
	c, err := netfilter.Dial(f.netlinkConfig())
	if err != nil {
		return fmt.Errorf("dial conntrack events: %w", err)
	}
	var once sync.Once
	closeConn := func() { once.Do(func() { _ = c.Close() }) }
	defer closeConn()
	stop := context.AfterFunc(ctx, closeConn)
	defer stop()
	if err := c.SetReadBuffer(f.cfg.ReadBuffer); err != nil {
		return fmt.Errorf("conntrack events: read buffer: %w", err)
	}
	if err := c.JoinGroups([]netfilter.NetlinkGroup{netfilter.GroupCTNew, netfilter.GroupCTDestroy}); err != nil {
		return fmt.Errorf("conntrack events: join groups: %w", err)
	}
	// joined first, so that no flow starts between the dump and the events
	if err := f.dumpResync(); err != nil {
		return err
	}
	f.once.Do(func() { close(f.ready) })
	var last time.Time
	pending := false
	for {
		msgs, err := c.Receive()
		if errors.Is(err, unix.ENOBUFS) {
			f.overruns.Add(1)
			pending = true
		} else if err != nil {
			return fmt.Errorf("conntrack events: receive: %w", err)
		}
		for _, m := range msgs {
			var ev conntrack.Event
			if err := ev.Unmarshal(m); err != nil {
				f.bad.Add(1)
				continue
			}
			f.Handle(ev)
		}
		if pending && time.Since(last) >= resyncEvery {
			pending, last = false, time.Now()
			if err := f.dumpResync(); err != nil {
				return err
			}
		}
	}
}

// dumpResync dumps the node's conntrack table and resyncs with it.
func (f *Flows) dumpResync() error {
	dc, err := conntrack.Dial(f.netlinkConfig())
	if err != nil {
		return fmt.Errorf("dial conntrack: %w", err)
	}
	defer dc.Close()
	gen := f.log.lastGen() // before the dump: a ring made during it is newer
	table, err := dc.Dump(nil)
	if err != nil {
		return fmt.Errorf("dump conntrack: %w", err)
	}
	f.resync(table, gen)
	return nil
}

// IfPrefix is an address of an interface with its prefix.
type IfPrefix struct {
	Iface  string
	Prefix netip.Prefix
}

// Prefixes lists the IPv4 addresses of the namespace's interfaces.
func (l *NetlinkLinks) Prefixes() ([]IfPrefix, error) {
	links, err := l.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("egress: list links: %w", err)
	}
	names := make(map[int]string, len(links))
	for _, ln := range links {
		names[ln.Attrs().Index] = ln.Attrs().Name
	}
	addrs, err := l.h.AddrList(nil, unix.AF_INET)
	if err != nil {
		return nil, fmt.Errorf("egress: list addresses: %w", err)
	}
	out := make([]IfPrefix, 0, len(addrs))
	for _, ad := range addrs {
		a, ok := netip.AddrFromSlice(ad.IP.To4())
		bits, _ := ad.Mask.Size()
		if name := names[ad.LinkIndex]; ok && name != "" {
			out = append(out, IfPrefix{Iface: name, Prefix: netip.PrefixFrom(a, bits)})
		}
	}
	return out, nil
}

// PrefixAddrs implements NodeAddrs over a list of the node's addresses
// (NetlinkLinks.Prefixes), read again at most once a second: a guest's
// address is in its zone's subnet, on-link on the zone's vnet bridge.
type PrefixAddrs struct {
	// List returns the node's addresses.
	List func() ([]IfPrefix, error)

	mu    sync.Mutex // guards the fields below
	nets  []IfPrefix // masked, longest first
	local map[netip.Addr]bool
	at    time.Time
}

// prefixTTL is how long PrefixAddrs uses one list.
const prefixTTL = time.Second

// BridgeOf implements NodeAddrs.
func (p *PrefixAddrs) BridgeOf(a netip.Addr) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fresh()
	for _, n := range p.nets {
		if n.Prefix.Contains(a) {
			return n.Iface, true
		}
	}
	return "", false
}

// IsLocal implements NodeAddrs.
func (p *PrefixAddrs) IsLocal(a netip.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fresh()
	return p.local[a]
}

// fresh reads the list again when it is older than prefixTTL; a failed
// read keeps the last good list.
func (p *PrefixAddrs) fresh() {
	now := time.Now()
	if p.local != nil && now.Sub(p.at) < prefixTTL {
		return
	}
	list, err := p.List()
	p.at = now
	if err != nil {
		if p.local == nil {
			p.local = map[netip.Addr]bool{}
		}
		return
	}
	p.nets, p.local = prefixIndex(list)
}

// prefixIndex returns the masked prefixes, longest first, and the
// addresses themselves.
func prefixIndex(list []IfPrefix) ([]IfPrefix, map[netip.Addr]bool) {
	nets := make([]IfPrefix, 0, len(list))
	local := make(map[netip.Addr]bool, len(list))
	for _, ip := range list {
		if !ip.Prefix.IsValid() {
			continue
		}
		local[ip.Prefix.Addr()] = true
		if ip.Prefix.Bits() < 32 {
			nets = append(nets, IfPrefix{Iface: ip.Iface, Prefix: ip.Prefix.Masked()})
		}
	}
	slices.SortStableFunc(nets, func(a, b IfPrefix) int { return cmp.Compare(b.Prefix.Bits(), a.Prefix.Bits()) })
	return nets, local
}

// Collector exports the counts as
// pve_inspect_egress_flow_events_total{result} (recorded, skipped,
// unattributed, untracked, over_share, unmatched, lost, bad) and
// pve_inspect_egress_flow_overruns_total.
func (f *Flows) Collector() prometheus.Collector { return flowCollector{f} }

type flowCollector struct{ f *Flows }

var (
	flowEventsDesc = prometheus.NewDesc("pve_inspect_egress_flow_events_total",
		"Conntrack events of guest flows by what the egress record did with them.", []string{"result"}, nil)
	flowOverrunsDesc = prometheus.NewDesc("pve_inspect_egress_flow_overruns_total",
		"Overruns (ENOBUFS) of the conntrack event socket: events the kernel dropped before the daemon read them.", nil, nil)
)

// Describe implements prometheus.Collector.
func (c flowCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- flowEventsDesc
	ch <- flowOverrunsDesc
}

// Collect implements prometheus.Collector.
func (c flowCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.f.Stats()
	for _, r := range []struct {
		result string
		n      uint64
	}{{"recorded", st.Recorded}, {"skipped", st.Skipped}, {"unattributed", st.Unattributed}, {"untracked", st.Untracked},
		{"over_share", st.OverShare},
		{"unmatched", st.Unmatched}, {"lost", st.Lost}, {"bad", st.Bad}} {
		ch <- prometheus.MustNewConstMetric(flowEventsDesc, prometheus.CounterValue, float64(r.n), r.result)
	}
	ch <- prometheus.MustNewConstMetric(flowOverrunsDesc, prometheus.CounterValue, float64(st.Overruns))
}
