package egress

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// DropReader reads the kernel's denial sets (*firewall.Guard).
type DropReader interface {
	EgressDrops(ctx context.Context) (ifaces, dests []firewall.EgressDrop, err error)
}

// OwnerOf names the owner of a guest interface's policy, its generation
// and the generation its instance began at, and runs fn while that
// instance (or generation) is still the interface's, so that nothing is
// written for an instance already gone (*Registry).
type OwnerOf interface {
	ForInstance(iface string) (owner string, gen, began uint64, err error)
	IfCurrent(iface string, gen uint64, fn func()) bool
	IfInstance(iface string, began uint64, fn func()) bool
	// Seq is the number of the last change of any policy; a generation
	// is the Seq of the change that made it.
	Seq() uint64
}

// dropKey is one member of the destination set.
type dropKey struct {
	iface string
	addr  netip.Addr
}

// dropCount is a destination member's counter.
type dropCount struct{ packets, bytes uint64 }

// since returns how much c grew since before: a member smaller than
// before expired and came back, so all of it is new.
func (c dropCount) since(before dropCount, had bool) dropCount {
	if !had || c.packets < before.packets || c.bytes < before.bytes {
		return c
	}
	return dropCount{c.packets - before.packets, c.bytes - before.bytes}
}

// KernelDrops turns the packets the guard's egress rules drop (a
// disallowed or denied address, any address from a none zone) into
// per-sandbox denials with reason ReasonAddress and records in the
// sandbox's egress record. The kernel counts them in two dynamic sets,
// per guest interface and per interface and destination; KernelDrops
// reads both every interval and attributes the growth of each member
// through the registry. The count comes from the per interface set
// (exact: a guest cannot add interfaces); the recent denials name each
// destination whose member grew, and each such member is one record of
// type RecordFlow, verdict VerdictRefused, reason ReasonAddress: the
// destination address (port 0: the set is keyed by interface and
// address, no protocol or port), the packets and IP bytes dropped to it
// since the last read (PacketsOut, BytesOut; the member's counter counts
// both), timed at the read (up to one interval after the packets). The
// interface is the zone's bridge, which all its VMs share, so the record
// names no VM (Guest is zero). A record, a count and a noted
// destination go to the owner only while the instance it was attributed
// to is the interface's (Registry.IfInstance; for an interface under the
// node default, while its policy generation is current:
// Registry.IfCurrent), so a deleted sandbox's or a claimed pool member's
// drops never land in the next instance's denials or record.
//
// What it keeps is bounded by the sets' sizes (firewall.EgressDeniedSize),
// and each read costs one netlink dump whatever the guest's packet rate;
// it writes at most one record per destination member per read, into
// rings bounded like every record. Growth across a change of the
// interface's instance (a pool member claimed, a zone given to another
// owner or removed: Registry.ForInstance) is taken as a new baseline,
// not counted: it may be the old instance's. A policy change of the same
// instance (its sandbox's policy set again) keeps counting: the drops
// before and after it are that sandbox's. An interface under the node
// default has no instance of its own; there any new policy generation
// since the last read is a new baseline.
type KernelDrops struct {
	r      DropReader
	own    OwnerOf
	den    *Denials
	rec    *Log
	every  time.Duration
	logger *slog.Logger

	primed bool
	ifs    map[string]uint64
	dests  map[dropKey]dropCount
	gens   map[string]uint64 // interface -> generation of its policy at the last read
	seq    uint64            // the registry's Seq before the last read's dump
}

// NewKernelDrops returns a reader of r's denial sets, attributing through
// own and recording into den and rec (nil: no records) every interval
// (zero: two seconds).
func NewKernelDrops(r DropReader, own OwnerOf, den *Denials, rec *Log, every time.Duration, logger *slog.Logger) *KernelDrops {
	if every <= 0 {
		every = 2 * time.Second
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &KernelDrops{r: r, own: own, den: den, rec: rec, every: every, logger: logger}
}

// Run polls until ctx is done. The first read is the baseline: what the
// sets held before (a persisted table adopted after a restart) is not
// counted again.
func (k *KernelDrops) Run(ctx context.Context) error {
	t := time.NewTicker(k.every)
	defer t.Stop()
	for {
		if err := k.Poll(ctx); err != nil && ctx.Err() == nil {
			k.logger.Warn("read egress drops", "component", "egress", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// grown returns how much a member grew since the last read: a member
// smaller than before expired and came back, so all of it is new.
func grown(now, before uint64, had bool) uint64 {
	if !had || now < before {
		return now
	}
	return now - before
}

// Poll reads the sets once and records what grew since the last read.
// The first successful Poll only takes the baseline.
func (k *KernelDrops) Poll(ctx context.Context) error {
	seq := k.own.Seq() // before the dump: a policy changed after it may have packets in it
	ifs, dests, err := k.r.EgressDrops(ctx)
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	at := time.Now().UTC()
	owners := map[string]ownerGen{}
	ownerOf := func(iface string) ownerGen {
		o, ok := owners[iface]
		if !ok {
			o = k.owner(iface)
			owners[iface] = o
		}
		return o
	}
	nextIfs := make(map[string]uint64, len(ifs))
	for _, d := range ifs {
		nextIfs[d.Iface] = d.Packets
		before, had := k.ifs[d.Iface]
		if o := ownerOf(d.Iface); o.ok && k.same(d.Iface, o) {
			if n := grown(d.Packets, before, had); k.primed && n > 0 {
				k.whileInstance(d.Iface, o, func() { k.den.Add(o.owner, ReasonAddress, n) })
			}
		}
	}
	nextDests := make(map[dropKey]dropCount, len(dests))
	for _, d := range dests {
		key, c := dropKey{d.Iface, d.Addr}, dropCount{d.Packets, d.Bytes}
		nextDests[key] = c
		before, had := k.dests[key]
		if o := ownerOf(d.Iface); o.ok && k.same(d.Iface, o) {
			if n := c.since(before, had); k.primed && n.packets > 0 {
				k.record(d.Iface, o, d.Addr, n, at)
			}
		}
	}
	gens := make(map[string]uint64, len(owners))
	for iface, o := range owners {
		if o.ok {
			gens[iface] = o.gen
		}
	}
	k.ifs, k.dests, k.gens, k.seq, k.primed = nextIfs, nextDests, gens, seq, true
	return nil
}

// whileInstance runs fn under the registry's lock if o is still iface's
// instance (its generation, for an interface under the node default), so
// that nothing of a read is written for an owner whose instance ended
// (Begin, Remove: Denials.Forget ran) between the attribution and the
// write.
func (k *KernelDrops) whileInstance(iface string, o ownerGen, fn func()) {
	if o.began != 0 {
		k.own.IfInstance(iface, o.began, fn)
	} else {
		k.own.IfCurrent(iface, o.gen, fn)
	}
}

// record notes dest among o's owner's recent denials and adds the record
// of n packets dropped from iface to it, read at at, to the owner's ring,
// if o is still iface's instance.
func (k *KernelDrops) record(iface string, o ownerGen, dest netip.Addr, n dropCount, at time.Time) {
	var ring *Ring
	k.whileInstance(iface, o, func() {
		k.den.Remember(o.owner, Denial{Reason: ReasonAddress, Dest: dest.String()})
		ring = k.rec.Open(o.owner)
	})
	ring.Add(Record{Time: at, Type: RecordFlow, Verdict: VerdictRefused, Reason: ReasonAddress,
		Dest: netip.AddrPortFrom(dest, 0), PacketsOut: clampInt64(n.packets), BytesOut: clampInt64(n.bytes)})
}

// ownerGen is an interface's owner, policy generation and the
// generation its instance began at (zero: no instance of its own) at one
// read.
type ownerGen struct {
	owner      string
	gen, began uint64
	ok         bool
}

// same reports whether iface's instance o was in force before the last
// read's dump, so that all the growth since that read is its. For an
// interface of a zone's own policy: its instance began no later than
// that read's Seq, whatever policy changes it had since. For one under
// the node default: its policy's generation is no newer than that read
// (a policy change, a zone created, a pool member claimed since, whether
// or not the interface had drops then, make a newer one) and is the one
// that read found (a zone removed since leaves its bridges generation
// 0). Otherwise the growth is a new baseline: it may be the instance's
// before. What stays: an interface with no drops at the last read whose
// zone was removed since reads generation 0 as if never changed, and its
// drops since the last read go to the owner the bridge has now (the node
// default's, never another sandbox's: a sandbox's zone on it would be a
// newer instance).
func (k *KernelDrops) same(iface string, o ownerGen) bool {
	if o.began != 0 {
		return o.began <= k.seq
	}
	g, had := k.gens[iface]
	return o.gen <= k.seq && (!had || g == o.gen)
}

func (k *KernelDrops) owner(iface string) ownerGen {
	owner, gen, began, err := k.own.ForInstance(iface)
	if err != nil {
		return ownerGen{}
	}
	return ownerGen{owner: owner, gen: gen, began: began, ok: true}
}
