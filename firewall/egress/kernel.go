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

// OwnerOf names the owner of a guest interface's policy and its
// generation (*Registry).
type OwnerOf interface {
	ForGen(iface string) (Rules, string, uint64, error)
}

// dropKey is one member of the destination set.
type dropKey struct {
	iface string
	addr  netip.Addr
}

// KernelDrops turns the packets the guard's egress rules drop (a
// disallowed or denied address, any address from a none zone) into
// per-sandbox denials with reason ReasonAddress. The kernel counts them
// in two dynamic sets, per guest interface and per interface and
// destination; KernelDrops reads both every interval and attributes the
// growth of each member through the registry. The count comes from the
// per interface set (exact: a guest cannot add interfaces); the recent
// denials name each destination whose member grew.
//
// What it keeps is bounded by the sets' sizes (firewall.EgressDeniedSize),
// and each read costs one netlink dump whatever the guest's packet rate.
// Growth across a change of the interface's policy (a new generation
// since the last read: a policy change, a pool member claimed) is taken
// as a new baseline, not counted: it may be the old instance's.
type KernelDrops struct {
	r     DropReader
	own   OwnerOf
	den   *Denials
	every time.Duration
	log   *slog.Logger

	primed bool
	ifs    map[string]uint64
	dests  map[dropKey]uint64
	gens   map[string]uint64 // interface -> generation of its policy at the last read
}

// NewKernelDrops returns a reader of r's denial sets, attributing through
// own and recording into den every interval (zero: two seconds).
func NewKernelDrops(r DropReader, own OwnerOf, den *Denials, every time.Duration, log *slog.Logger) *KernelDrops {
	if every <= 0 {
		every = 2 * time.Second
	}
	if log == nil {
		log = slog.Default()
	}
	return &KernelDrops{r: r, own: own, den: den, every: every, log: log}
}

// Run polls until ctx is done. The first read is the baseline: what the
// sets held before (a persisted table adopted after a restart) is not
// counted again.
func (k *KernelDrops) Run(ctx context.Context) error {
	t := time.NewTicker(k.every)
	defer t.Stop()
	for {
		if err := k.Poll(ctx); err != nil && ctx.Err() == nil {
			k.log.Warn("read egress drops", "component", "egress", "err", err)
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
	ifs, dests, err := k.r.EgressDrops(ctx)
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
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
				k.den.Add(o.owner, ReasonAddress, n)
			}
		}
	}
	nextDests := make(map[dropKey]uint64, len(dests))
	for _, d := range dests {
		key := dropKey{d.Iface, d.Addr}
		nextDests[key] = d.Packets
		before, had := k.dests[key]
		if o := ownerOf(d.Iface); o.ok && k.same(d.Iface, o) {
			if n := grown(d.Packets, before, had); k.primed && n > 0 {
				k.den.Remember(o.owner, Denial{Reason: ReasonAddress, Dest: d.Addr.String()})
			}
		}
	}
	gens := make(map[string]uint64, len(owners))
	for iface, o := range owners {
		if o.ok {
			gens[iface] = o.gen
		}
	}
	k.ifs, k.dests, k.gens, k.primed = nextIfs, nextDests, gens, true
	return nil
}

// ownerGen is an interface's owner and policy generation at one read.
type ownerGen struct {
	owner string
	gen   uint64
	ok    bool
}

// same reports whether iface's policy is the one of the last read (an
// interface not seen then has no growth to attribute but its own).
func (k *KernelDrops) same(iface string, o ownerGen) bool {
	g, had := k.gens[iface]
	return !had || g == o.gen
}

func (k *KernelDrops) owner(iface string) ownerGen {
	_, owner, gen, err := k.own.ForGen(iface)
	if err != nil {
		return ownerGen{}
	}
	return ownerGen{owner: owner, gen: gen, ok: true}
}
