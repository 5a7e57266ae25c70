package firewall

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

// Option configures a Guard (and the package functions that touch the
// kernel).
type Option func(*options)

type options struct {
	ns     *netns.NsHandle
	logger *slog.Logger
	now    func() time.Time
	sw     Switches
	egress map[string]ZoneEgress
}

// WithNetNS makes the guard work on the network namespace ns instead of
// the caller's (tests, the bench). The handle must stay open while the
// guard is in use.
func WithNetNS(ns netns.NsHandle) Option { return func(o *options) { o.ns = &ns } }

// WithSwitches sets the switches Start applies (default: lockdown and
// fail-closed off). A daemon restarting while the lockdown is asked for
// passes them on, so that adopting the orphaned table keeps the @lockdown
// and @failclosed sets filled: with both off, Start would empty them until
// the lockdown controller's first reconcile, a window in which guests have
// egress.
func WithSwitches(sw Switches) Option { return func(o *options) { o.sw = sw } }

// WithLogger sets the logger; the guard adds component=guard.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

func buildOptions(opts []Option) options {
	o := options{logger: slog.New(slog.DiscardHandler), now: time.Now}
	for _, f := range opts {
		f(&o)
	}
	return o
}

func (o options) nftOpts(lasting bool) []nftables.ConnOption {
	var co []nftables.ConnOption
	if lasting {
		co = append(co, nftables.AsLasting())
	}
	if o.ns != nil {
		co = append(co, nftables.WithNetNSFd(int(*o.ns)))
	}
	return co
}

// OwnedError is returned when table inet pve-inspect is owned by another
// live process (another daemon): the kernel refuses every change from us.
type OwnedError struct {
	// Port is the netlink port id of the owner (usually its pid).
	Port uint32
}

func (e *OwnedError) Error() string {
	return fmt.Sprintf("table inet %s is owned by another process (netlink port %d)", TableName, e.Port)
}

// Guard keeps table inet pve-inspect in force. It owns the table through
// one lasting netlink connection (the kernel binds ownership to that
// socket): every change goes through it, in one batch each, under mu.
//
// Design decisions:
//   - Everything that changes at run time (management interfaces, lockdown,
//     fail-closed) is set membership; rules are only ever written whole, so
//     their counters survive every switch.
//   - The fail-closed blanket drop is "meta nfproto @failclosed drop": inert
//     while the set is empty, all of IPv4 and IPv6 when filled.
//   - Cross-zone isolation needs no knowledge of new bridges: forwarding
//     between two non-management interfaces is dropped unless the pair is in
//     @zone_peers (same configured zone, an interface with itself, or two
//     trusted interfaces). An unknown vnet is isolated, never exposed.
//   - The input policy keys on the incoming interface, not the address, so
//     every node address (management, gateway, other) is covered.
//   - The table is never deleted on exit: persist keeps it in the kernel
//     while no daemon runs, and Start re-adopts it (or rebuilds it in the
//     same batch that deletes a stale one), so it is never absent.
type Guard struct {
	cfg  Config
	opts options
	log  *slog.Logger
	cls  *classifier
	met  *metrics

	mu      sync.Mutex // serializes every write and the state below
	conn    *nftables.Conn
	port    uint32
	state   Classification
	sw      Switches
	desired *Ruleset
	zones   map[string][]string   // run-time zones (SetZones)
	egress  map[string]ZoneEgress // run-time zones' egress (SetEgress)
	bridge  *Ruleset              // desired layer-2 table (bridgeguard.go)
	arp     *Ruleset              // desired arp table: no ARP on guest port devices (arptable.go)
	ports   []Port                // run-time guest port map (SetPorts)
	started bool
	// mergedZones (configured and run-time zones, as Render names them)
	// and zoneOf (bridge -> its merged zone ids) index g.zones for the
	// update path (update.go).
	mergedZones map[string][]string
	zoneOf      map[string][]string
	// gen counts the batches the kernel took, so that a verify reading
	// the kernel without mu knows whether its reading is still current
	gen uint64

	subMu sync.Mutex
	subs  map[chan struct{}]struct{}

	// readMu guards rd, the reader verifies read the kernel with
	// without mu; it is never held while taking mu or the other way round.
	readMu sync.Mutex
	rd     *tableReader

	// dump reads rules and set elements under mu (next to conn).
	dump *dumper

	// metricsMu guards mrd, the connection a metrics scrape reads the
	// counters on.
	metricsMu sync.Mutex
	mrd       *tableReader
}

// New prepares a guard; it changes nothing until Start.
func New(cfg Config, opts ...Option) (*Guard, error) {
	o := buildOptions(opts)
	cl, err := newClassifier(o.ns, cfg.Trusted)
	if err != nil {
		return nil, err
	}
	conn, err := nftables.New(o.nftOpts(true)...)
	if err != nil {
		cl.close()
		return nil, fmt.Errorf("open nftables connection: %w", err)
	}
	port, err := conn.GetPortID()
	if err != nil {
		cl.close()
		_ = conn.CloseLasting()
		return nil, fmt.Errorf("nftables port id: %w", err)
	}
	// Every socket the guard reads and writes the kernel on is opened
	// now, while the process has few descriptors: google/nftables waits
	// for replies with pselect(2), whose fd_set holds descriptors below
	// 1024 only (a higher one panics in x/sys/unix.FdSet.Set), and a
	// busy daemon holds more than that later (agent sockets, API
	// connections).
	g := &Guard{cfg: cfg, opts: o, log: o.logger.With("component", "guard"), cls: cl,
		conn: conn, port: port, sw: o.sw, subs: map[chan struct{}]struct{}{}}
	fail := func(err error) (*Guard, error) {
		cl.close()
		_ = conn.CloseLasting()
		if g.dump != nil {
			_ = g.dump.Close()
		}
		if g.rd != nil {
			_ = g.rd.Close()
		}
		if g.mrd != nil {
			_ = g.mrd.Close()
		}
		return nil, err
	}
	if g.dump, err = newDumper(o.ns); err != nil {
		return fail(err)
	}
	if g.rd, err = openReader(o); err != nil {
		return fail(fmt.Errorf("verify: %w", err))
	}
	if g.mrd, err = openReader(o); err != nil {
		return fail(fmt.Errorf("metrics: %w", err))
	}
	if g.egress, err = cloneEgress(o.egress); err != nil {
		return fail(fmt.Errorf("egress: %w", err))
	}
	g.met = newMetrics(g)
	return g, nil
}

// Close releases the guard's connections. The table stays in the kernel
// (persist): it is orphaned until the next Start re-adopts it.
func (g *Guard) Close() error {
	var errs []error
	g.readMu.Lock()
	if g.rd != nil {
		errs = append(errs, g.rd.Close())
		g.rd = nil
	}
	g.readMu.Unlock()
	g.metricsMu.Lock()
	if g.mrd != nil {
		errs = append(errs, g.mrd.Close())
		g.mrd = nil
	}
	g.metricsMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cls.close()
	return errors.Join(append(errs, g.conn.CloseLasting(), g.dump.Close())...)
}

// Start puts the guard in force: it disables IPv6 on new interfaces,
// classifies the interfaces, turns on the loose source check of the guest
// ports (checkPortSources), then in one batch creates the table, re-adopts
// an orphaned one (its rules and counters kept), or rebuilds one that was
// deleted, edited, or created without the owner|persist flags. It returns
// nil only once Verify has found the kernel's table equal to the desired
// one and owned by this guard.
func (g *Guard) Start(ctx context.Context) error {
	if err := inNS(g.opts.ns, func() error { return disableIPv6Default(g.cfg) }); err != nil {
		return fmt.Errorf("start guard: %w", err)
	}
	cls, err := g.cls.classify()
	if err != nil {
		return fmt.Errorf("start guard: %w", err)
	}
	var guestPorts []string
	for _, e := range cls.Enslaved {
		if isGuestPortName(e.Port) {
			guestPorts = append(guestPorts, e.Port)
		}
	}
	if err := inNS(g.opts.ns, func() error { return checkPortSources(g.cfg, guestPorts) }); err != nil {
		return fmt.Errorf("start guard: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	rs, err := Render(g.renderConfig(g.zones), cls, g.sw)
	if err != nil {
		return fmt.Errorf("start guard: render: %w", err)
	}
	withGuestAddrs(rs, g.ports)
	brs, err := RenderBridge(zoneBridges(g.renderConfig(g.zones)), cls, g.ports, g.cfg.Flood)
	if err != nil {
		return fmt.Errorf("start guard: render bridge table: %w", err)
	}
	g.state, g.desired, g.bridge, g.arp = cls, normalized(rs), normalized(brs), normalized(RenderARP(cls))
	g.indexZonesLocked(g.zones)
	err = g.convergeLocked(ctx, true)
	var de *DriftError
	if errors.As(err, &de) {
		// changed by someone between our read and our adopting batch; we
		// own it now, so one more pass settles it
		err = g.convergeLocked(ctx, false)
	}
	if err != nil {
		return fmt.Errorf("start guard: %w", err)
	}
	g.started = true
	// after the table: its ct rules have conntrack loaded
	if err := inNS(g.opts.ns, func() error { return enableConntrackAcct(g.cfg) }); err != nil {
		g.log.Warn("conntrack accounting off: the egress record's flows have no byte counts", "err", err)
	}
	if err := CheckNodeConnLimit(g.cfg.procRoot(), g.cfg.Flood); errors.Is(err, ErrNodeConnLimit) {
		g.log.Warn("guests can fill the node's conntrack table", "err", err)
	} else if err != nil {
		g.log.Debug("nf_conntrack_max not checked", "err", err)
	}
	if err := markApplied(g.cfg); err != nil {
		// only the repairs metric after a restart depends on it
		g.log.Warn("cannot record that the table was applied", "err", err)
	}
	g.log.Info("guard in force", "management", cls.Management, "rules", rs.RuleCount())
	return nil
}

// convergeLocked makes the kernel's tables (inet and bridge) equal to the
// desired ones in one batch and verifies them. adopting allows taking over
// orphaned tables.
func (g *Guard) convergeLocked(ctx context.Context, adopting bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	start := g.opts.now()
	var actions []string
	want := g.tablesLocked()
	ks, err := readKernelTables(g.readerLocked(), families(want), func(nftables.TableFamily) func(string) bool {
		return func(string) bool { return true }
	})
	if err != nil {
		return err
	}
	for _, rs := range want {
		action, err := g.queueConvergeLocked(rs, ks[rs.family()], adopting)
		if err != nil {
			return err
		}
		if action != "" {
			actions = append(actions, rs.TableRef()+": "+action)
		}
	}
	if len(actions) > 0 {
		action := strings.Join(actions, ", ")
		if err := g.conn.Flush(); err != nil {
			if errors.Is(err, syscall.EPERM) {
				return fmt.Errorf("%s: %w (owned by another process?)", action, err)
			}
			if errors.Is(err, syscall.EOPNOTSUPP) {
				return fmt.Errorf("%s: %w (the table flags owner|persist need Linux 6.9 or newer)", action, err)
			}
			return fmt.Errorf("%s: %w", action, err)
		}
		g.gen++
		g.met.observeApply(g.opts.now().Sub(start))
		g.log.Info("table applied", "action", action)
	}
	return g.verifyLocked()
}

// tablesLocked are the desired tables: inet, then bridge (once rendered).
func (g *Guard) tablesLocked() []*Ruleset {
	if g.bridge == nil {
		return []*Ruleset{g.desired}
	}
	if g.arp == nil {
		return []*Ruleset{g.desired, g.bridge}
	}
	return []*Ruleset{g.desired, g.bridge, g.arp}
}

// queueConvergeLocked queues what makes the kernel's table k equal to rs
// and returns what it does ("" for nothing).
func (g *Guard) queueConvergeLocked(rs *Ruleset, k *kernelTable, adopting bool) (string, error) {
	repair := g.met.repairer(rs)
	adopt := func() {
		g.conn.AddTable(&nftables.Table{Name: TableName, Family: rs.family(), Flags: TableFlags})
	}
	switch {
	case k.table == nil:
		// A table missing after it was applied since boot (the marker
		// lives in /run) was deleted: a repair. At first start after boot
		// it is just the install.
		if !adopting || appliedBefore(g.cfg) {
			repair(DriftTableMissing)
		}
		return "create", queueTable(g.conn, rs, false)
	case k.table.Flags&nftables.TableFlagOwner != 0 && k.table.Owner != g.port:
		return "", &OwnedError{Port: k.table.Owner}
	case k.table.Flags&nftables.TableFlagPersist == 0:
		repair(DriftTableFlags)
		return "replace table without persist flag", queueTable(g.conn, rs, true)
	}
	ds := diff(rs, k, 0)
	orphan := k.table.Flags&nftables.TableFlagOwner == 0
	if orphan && !adopting {
		repair(DriftTableOwner)
	}
	switch {
	case len(ds) == 0 && !orphan:
		return "", nil
	case onlyElements(ds):
		for _, d := range ds {
			repair(d.Kind)
		}
		action := "update sets"
		if orphan {
			action = "adopt and update sets"
			adopt()
		}
		_, err := queueSetUpdates(g.conn, rs, k.elems)
		return action, err
	case len(ds) == 0:
		adopt()
		return "adopt", nil
	default:
		for _, d := range ds {
			repair(d.Kind)
		}
		g.log.Warn("table differs from desired, rebuilding", "table", rs.TableRef(), "drift", (&DriftError{ds}).Error())
		return "rebuild", queueTable(g.conn, rs, true)
	}
}

// verifyLocked compares the kernel's table with g.desired, ownership
// included.
func (g *Guard) verifyLocked() error {
	ks, err := readTables(g.readerLocked(), g.tablesLocked())
	if err != nil {
		return err
	}
	return g.compareLocked(ks)
}

// readTables reads the kernel's tables of the desired ones, with the
// members of the sets a verify compares.
func readTables(r *tableReader, want []*Ruleset) (map[nftables.TableFamily]*kernelTable, error) {
	compared := map[nftables.TableFamily]func(string) bool{}
	for _, rs := range want {
		compared[rs.family()] = comparedSets(rs)
	}
	ks, err := readKernelTables(r, families(want), func(fam nftables.TableFamily) func(string) bool { return compared[fam] })
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	return ks, nil
}

// readerLocked reads with the guard's own connection and dumper (mu held).
func (g *Guard) readerLocked() *tableReader { return &tableReader{c: g.conn, d: g.dump} }

// families are the families of the tables of want, in order.
func families(want []*Ruleset) []nftables.TableFamily {
	out := make([]nftables.TableFamily, len(want))
	for i, rs := range want {
		out[i] = rs.family()
	}
	return out
}

// readOffLock reads the tables on the guard's read connection (lasting
// sockets of its own, opened in New: a dial per dump costs more than the
// dump inside a network namespace).
func (g *Guard) readOffLock(want []*Ruleset) (map[nftables.TableFamily]*kernelTable, error) {
	g.readMu.Lock()
	defer g.readMu.Unlock()
	if g.rd == nil {
		return nil, errors.New("verify: guard closed")
	}
	return readTables(g.rd, want)
}

// verifyOffLock is verifyLocked with the kernel read without holding mu
// (at thousands of bridges the reading is the long part, and every
// change would wait for it); the comparison takes mu, and a batch sent
// meanwhile (seen in the generation, or as a dump the kernel flagged
// interrupted) means reading again. After a few such races it reads
// under mu.
func (g *Guard) verifyOffLock(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		g.mu.Lock()
		gen, bridge, started := g.gen, g.bridge != nil, g.desired != nil
		want := g.tablesLocked()
		if !started || attempt == 3 {
			defer g.mu.Unlock()
			if !started {
				return errors.New("verify: guard not started")
			}
			return g.verifyLocked()
		}
		g.mu.Unlock()
		// the desired sets are read for their names and flags only,
		// which never change in place
		ks, err := g.readOffLock(want)
		if errors.Is(err, errDumpInterrupted) {
			// a batch (ours, sent meanwhile) changed the ruleset while it
			// was dumped: read again, as for a change seen below
			continue
		}
		if err != nil {
			return err
		}
		g.mu.Lock()
		if g.gen != gen || (g.bridge != nil) != bridge {
			g.mu.Unlock()
			continue
		}
		err = g.compareLocked(ks)
		g.mu.Unlock()
		return err
	}
}

// compareLocked compares the tables read with the desired ones.
func (g *Guard) compareLocked(ks map[nftables.TableFamily]*kernelTable) error {
	var all []Drift
	for _, rs := range g.tablesLocked() {
		k := ks[rs.family()]
		if k == nil {
			return fmt.Errorf("verify: %s not read", rs.TableRef())
		}
		ds := diff(rs, k, g.port)
		if f := rs.family(); f != nftables.TableFamilyINet {
			prefix := map[nftables.TableFamily]string{nftables.TableFamilyBridge: "bridge:", nftables.TableFamilyARP: "arp:"}[f]
			for i := range ds {
				ds[i].Object = prefix + ds[i].Object
			}
		}
		all = append(all, ds...)
	}
	if len(all) > 0 {
		return &DriftError{Drifts: all}
	}
	g.met.verified(g.opts.now())
	return nil
}

// Verify compares the kernel's table with the desired one and returns a
// *DriftError listing every difference, nil when equal. It changes nothing.
func (g *Guard) Verify(ctx context.Context) error {
	return g.verifyOffLock(ctx)
}

// repair verifies and, on drift, converges (one batch), counting repairs
// by reason.
func (g *Guard) repair(ctx context.Context) error {
	var de *DriftError
	if err := g.verifyOffLock(ctx); !errors.As(err, &de) {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	err := g.verifyLocked() // the drift may be gone (a batch of ours raced)
	if !errors.As(err, &de) {
		return err
	}
	g.log.Warn("tamper or drift detected, repairing", "drift", de.Error())
	return g.convergeLocked(ctx, false)
}

// applySwitchesLocked renders with new switches or classification and
// updates only the sets that change, in one batch. On error the previous
// state is kept.
func (g *Guard) applyLocked(ctx context.Context, cls Classification, sw Switches) error {
	return g.applyZonesLocked(ctx, cls, sw, g.zones)
}

// applyZonesLocked is applyLocked with run-time zones too.
func (g *Guard) applyZonesLocked(ctx context.Context, cls Classification, sw Switches, zones map[string][]string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if g.desired == nil {
		return errors.New("guard not started")
	}
	rs, err := Render(g.renderConfig(zones), cls, sw)
	if err != nil {
		return fmt.Errorf("render: %w", err)
	}
	withGuestAddrs(rs, g.ports)
	brs, err := RenderBridge(zoneBridges(g.renderConfig(zones)), cls, g.ports, g.cfg.Flood)
	if err != nil {
		return fmt.Errorf("render bridge table: %w", err)
	}
	ars := RenderARP(cls)
	if err := g.updateSetsLocked(rs, brs, ars); err != nil {
		return err
	}
	g.state, g.sw, g.desired, g.bridge, g.zones = cls, sw, normalized(rs), normalized(brs), zones
	if g.arp != nil {
		g.arp = normalized(ars)
	}
	g.indexZonesLocked(zones)
	return nil
}

// updateSetsLocked queues, for every table, the sets whose members differ
// from the desired ones, and sends them in one batch. Rules and counters
// are untouched.
func (g *Guard) updateSetsLocked(rs, brs, ars *Ruleset) error {
	start := g.opts.now()
	total := 0
	pairs := [][2]*Ruleset{{g.desired, rs}, {g.bridge, brs}}
	if g.arp != nil {
		pairs = append(pairs, [2]*Ruleset{g.arp, ars})
	}
	for _, p := range pairs {
		cur := map[string][]nftables.SetElement{}
		for _, s := range p[0].Sets {
			cur[s.Name] = s.Elements
		}
		n, err := queueSetUpdates(g.conn, p[1], cur)
		if err != nil {
			return err
		}
		total += n
	}
	if total > 0 {
		if err := g.conn.Flush(); err != nil {
			return fmt.Errorf("update sets: %w", err)
		}
		g.gen++
		g.met.observeApply(g.opts.now().Sub(start))
	}
	return nil
}

// renderConfig is the configuration with the run-time zones added to the
// configured ones.
func (g *Guard) renderConfig(zones map[string][]string) Config {
	cfg := g.egressConfig()
	merged := map[string][]string{}
	for id, b := range g.cfg.Zones {
		merged[configZonePrefix+id] = b
	}
	for id, b := range zones {
		merged[runZonePrefix+id] = b
	}
	cfg.Zones = merged
	return cfg
}

// Prefixes of the zone ids a rendered configuration holds: the
// configured zones' ([guard] zones) and the run-time ones' (SetZones,
// SetEgress: the daemon's sandboxes).
const (
	configZonePrefix = "config:"
	runZonePrefix    = "run:"
)

// egressConfig is the configuration without zones, with the run-time
// zones' egress policies added to the configured ones.
func (g *Guard) egressConfig() Config {
	cfg := g.cfg.WithRunEgress(g.egress)
	cfg.Zones = nil
	return cfg
}

// WithRunEgress is cfg with the run-time zones' egress policies (the
// daemon's sandboxes': SetEgress, WithEgress, its state file) added to
// the configured ones, each id prefixed by where it came from, as the
// guard renders them (the run-time ones are the daemon's own, whose open
// zones' DNS goes through its resolver: ownOpenBridges). Render it to
// see what the running guard applies.
func (cfg Config) WithRunEgress(run map[string]ZoneEgress) Config {
	configured := cfg.ZoneEgress
	cfg.ZoneEgress = make(map[string]ZoneEgress, len(configured)+len(run))
	for id, z := range configured {
		cfg.ZoneEgress[configZonePrefix+id] = z
	}
	for id, z := range run {
		cfg.ZoneEgress[runZonePrefix+id] = z
	}
	return cfg
}

// SetZones replaces the run-time SDN zones (zone id -> its vnet bridges),
// added to the configured ones, for the sandbox API that creates zones.
// Bridges of one zone may forward to each other; everything else between
// non-management interfaces stays isolated. One batch; rules and counters
// stay.
func (g *Guard) SetZones(ctx context.Context, zones map[string][]string) error {
	cp := make(map[string][]string, len(zones))
	for id, b := range zones {
		for _, n := range b {
			if n == "" || len(n) > 15 {
				return fmt.Errorf("set zones: zone %s: bad bridge name %q", id, n)
			}
		}
		cp[id] = slices.Clone(b)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.desired == nil {
		return errors.New("set zones: guard not started")
	}
	if err := g.applyZoneChangesLocked(ctx, cp); err != nil {
		return fmt.Errorf("set zones: %w", err)
	}
	return nil
}

// applySwitchesLocked puts new switches in force: the members of
// @lockdown and @failclosed that change, in one batch.
func (g *Guard) applySwitchesLocked(ctx context.Context, sw Switches) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if g.desired == nil {
		return errors.New("guard not started")
	}
	cs := &changes{}
	g.replaceSmall(cs, SetLockdown, lockdownSet(g.state, sw))
	g.replaceSmall(cs, SetFailClosed, failClosedSet(sw))
	if _, err := g.commitLocked(cs); err != nil {
		return err
	}
	g.sw = sw
	return nil
}

// SetLockdown fills (on) or empties (off) the @lockdown set that the
// forward iifname/oifname drops and the dnsmasq output drop match, in one
// batch. Rules and counters stay. While on, the set follows @mgmt.
func (g *Guard) SetLockdown(ctx context.Context, on bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	sw := g.sw
	sw.Lockdown = on
	if err := g.applySwitchesLocked(ctx, sw); err != nil {
		return fmt.Errorf("set lockdown %v: %w", on, err)
	}
	return nil
}

// SetFailClosed enables (on) or disables (off) the blanket forward drop by
// filling or emptying @failclosed, in one batch. Rules and counters stay.
func (g *Guard) SetFailClosed(ctx context.Context, on bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	sw := g.sw
	sw.FailClosed = on
	if err := g.applySwitchesLocked(ctx, sw); err != nil {
		return fmt.Errorf("set fail-closed %v: %w", on, err)
	}
	return nil
}

// Switches returns the current lockdown and fail-closed switches.
func (g *Guard) Switches() Switches {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sw
}

// Management returns the current management interfaces (those carrying a
// default route), sorted. Empty means no default route.
func (g *Guard) Management() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.state.Management)
}

// Classification returns the current interface classification.
func (g *Guard) Classification() Classification {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state.clone()
}

// Desired returns a copy of the ruleset the guard keeps in force.
func (g *Guard) Desired() *Ruleset {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.desired.snapshot()
}

// shapes returns the desired tables without their sets (chains and rules
// only, which never change in place), for the metrics.
func (g *Guard) shapes() (inet, bridge *Ruleset) {
	g.mu.Lock()
	defer g.mu.Unlock()
	strip := func(rs *Ruleset) *Ruleset {
		if rs == nil {
			return nil
		}
		n := *rs
		n.Sets = nil
		return &n
	}
	return strip(g.desired), strip(g.bridge)
}

// Subscribe returns a channel that receives a value (coalesced, never
// blocking the guard) after every change of the interface classification
// has been applied, and a function that ends the subscription.
func (g *Guard) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	g.subMu.Lock()
	g.subs[ch] = struct{}{}
	g.subMu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			g.subMu.Lock()
			delete(g.subs, ch)
			g.subMu.Unlock()
		})
	}
}

func (g *Guard) notify() {
	g.subMu.Lock()
	defer g.subMu.Unlock()
	for ch := range g.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// reclassify applies the classification when it changed: the one the
// classifier keeps from events, or (full) a fresh listing. A change of
// interfaces and bridge ports only is applied by its difference; one of
// the management, trusted interfaces or uplink subnets renders the table.
func (g *Guard) reclassify(ctx context.Context, full bool) error {
	var cls Classification
	if full {
		var err error
		if cls, err = g.cls.classify(); err != nil {
			return err
		}
	} else {
		cls = g.cls.current()
	}
	g.mu.Lock()
	if cls.Equal(g.state) {
		g.mu.Unlock()
		return nil
	}
	var joined []string // guest ports new on a bridge: their source check
	for _, m := range enslavedDiff(g.state.Enslaved, cls.Enslaved) {
		if m.before == "" && m.after != "" && isGuestPortName(m.port) {
			joined = append(joined, m.port)
		}
	}
	var err error
	// A change of the management, trusted interfaces or uplink subnets is
	// what the log reports (Info, once per change); interfaces and bridge
	// ports come and go with every guest (Debug).
	structural := !slices.Equal(cls.Management, g.state.Management) || !slices.Equal(cls.Trusted, g.state.Trusted) ||
		!slices.Equal(cls.UplinkNets, g.state.UplinkNets)
	if structural {
		err = g.applyLocked(ctx, cls, g.sw)
	} else if err = g.applyLinksLocked(ctx, cls); errors.Is(err, errStructural) {
		err = g.applyLocked(ctx, cls, g.sw)
	}
	g.mu.Unlock()
	if len(joined) > 0 {
		err = errors.Join(err, inNS(g.opts.ns, func() error { return checkPortSources(g.cfg, joined) }))
	}
	if err != nil {
		return err
	}
	g.met.setManagement(cls.Management)
	if structural {
		g.log.Info("interface classification changed", "management", cls.Management, "trusted", cls.Trusted, "uplink_nets", cls.UplinkNets)
	} else {
		g.log.Debug("interfaces or bridge ports changed", "interfaces", len(cls.Interfaces), "bridge_ports", len(cls.Enslaved))
	}
	g.notify()
	return nil
}

// Run keeps the guard in force until ctx is done: route and link events
// update the interface sets, nftables events and a periodic timer trigger
// verify-and-repair. Start must have succeeded. It returns nil when ctx is
// done; failures to repair are logged, counted and retried, never ignored
// silently (Verify reports them to the lockdown controller).
func (g *Guard) Run(ctx context.Context) error {
	g.mu.Lock()
	started := g.started
	g.mu.Unlock()
	if !started {
		return errors.New("run guard: not started")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reclass := make(chan struct{}, 1)
	check := make(chan struct{}, 1)
	kick := func(c chan struct{}) {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		g.cls.watch(ctx, func() { kick(reclass) }, func(err error) {
			g.log.Warn("netlink subscription failed, resubscribing", "err", err)
		})
	}()
	go func() {
		defer wg.Done()
		g.monitor(ctx, func() { kick(check) })
	}()
	defer wg.Wait()

	t := time.NewTicker(g.cfg.verifyInterval())
	defer t.Stop()
	full := false // the next reclassify lists everything again
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-reclass:
			settle(ctx, reclass)
			if err := g.reclassify(ctx, full); err != nil && ctx.Err() == nil {
				g.log.Error("apply interface classification", "err", err)
				full = true
				kick(check)
				time.AfterFunc(retryAfter, func() { kick(reclass) })
				continue
			}
			full = false
		case <-check:
			if err := g.repair(ctx); err != nil && ctx.Err() == nil {
				g.log.Error("repair table", "err", err)
			}
		case <-t.C:
			full = true
			kick(reclass)
			if err := g.reconcile(ctx); err != nil && ctx.Err() == nil {
				g.log.Error("periodic check of the applied sets", "err", err)
			}
			if err := g.repair(ctx); err != nil && ctx.Err() == nil {
				g.log.Error("periodic verify", "err", err)
			}
			if err := g.checkSources(); err != nil && ctx.Err() == nil {
				g.log.Error("periodic check of the guest ports' source check", "err", err)
			}
		}
	}
}

// checkSources gives every guest port of the current classification its
// source check (checkPortSources): the backstop for a port whose link
// events left the classification equal (deleted and made again under its
// name between two looks, as an LXC container's reboot does; review 7).
// One read per port, off the guard's lock.
func (g *Guard) checkSources() error {
	g.mu.Lock()
	var ports []string
	for _, e := range g.state.Enslaved {
		if isGuestPortName(e.Port) {
			ports = append(ports, e.Port)
		}
	}
	g.mu.Unlock()
	return inNS(g.opts.ns, func() error { return checkPortSources(g.cfg, ports) })
}

// Event coalescing: the guard applies link and route events after
// settleQuiet without another one, or settleMax after the first, so a
// burst of new bridges is one batch (or a few), not one per event.
// retryAfter is the pause before a failed apply is tried again.
const (
	settleQuiet = 2 * time.Millisecond
	settleMax   = 10 * time.Millisecond
	retryAfter  = 100 * time.Millisecond
)

// settle waits until kicks on c stop for settleQuiet, at most settleMax.
func settle(ctx context.Context, c <-chan struct{}) {
	deadline := time.NewTimer(settleMax)
	defer deadline.Stop()
	quiet := time.NewTimer(settleQuiet)
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			return
		case <-quiet.C:
			return
		case <-c:
			quiet.Reset(settleQuiet)
		}
	}
}

// monitor watches nftables events on its own connection and calls changed
// for each; it re-creates the monitor when it ends.
func (g *Guard) monitor(ctx context.Context, changed func()) {
	for ctx.Err() == nil {
		err := g.monitorOnce(ctx, changed)
		if ctx.Err() != nil {
			return
		}
		g.log.Warn("nftables monitor ended, restarting", "err", err)
		changed()
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (g *Guard) monitorOnce(ctx context.Context, changed func()) error {
	conn, err := nftables.New(g.opts.nftOpts(false)...)
	if err != nil {
		return fmt.Errorf("open monitor connection: %w", err)
	}
	m := nftables.NewMonitor()
	defer m.Close()
	events, err := conn.AddMonitor(m)
	if err != nil {
		return fmt.Errorf("start monitor: %w", err)
	}
	changed() // anything before the monitor started
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return errors.New("monitor channel closed")
			}
			if ev.Error != nil {
				return ev.Error
			}
			if ev.Header.PID == g.port {
				continue // our own change, already verified by its writer
			}
			changed()
		}
	}
}

// RemoveTable deletes tables inet and bridge pve-inspect and restores the saved
// net.ipv6.conf.default.disable_ipv6 (`pve-inspectd guard remove`, the only
// way the table is taken away on purpose). The kernel refuses (EPERM) while
// a running daemon owns the table; stop it first.
func RemoveTable(ctx context.Context, cfg Config, opts ...Option) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	o := buildOptions(opts)
	rd, err := openReader(o)
	if err != nil {
		return err
	}
	defer rd.Close()
	conn := rd.c
	k, err := readKernel(rd)
	if err != nil {
		return err
	}
	bk, err := readKernelTable(rd, nftables.TableFamilyBridge)
	if err != nil {
		return err
	}
	ak, err := readKernelTable(rd, nftables.TableFamilyARP)
	if err != nil {
		return err
	}
	for _, t := range []*nftables.Table{k.table, bk.table, ak.table} {
		if t == nil {
			continue
		}
		if t.Flags&nftables.TableFlagOwner != 0 {
			return fmt.Errorf("remove table: %w", &OwnedError{Port: t.Owner})
		}
		conn.DelTable(&nftables.Table{Name: TableName, Family: t.Family})
	}
	if k.table != nil || bk.table != nil || ak.table != nil {
		if err := conn.Flush(); err != nil {
			return fmt.Errorf("remove table: %w", err)
		}
	}
	if err := inNS(o.ns, func() error { return restoreIPv6Default(cfg) }); err != nil {
		return fmt.Errorf("remove guard: %w", err)
	}
	if err := inNS(o.ns, func() error { return restoreConntrackAcct(cfg) }); err != nil {
		return fmt.Errorf("remove guard: %w", err)
	}
	if err := os.Remove(filepath.Join(cfg.stateDir(), appliedMarker)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove guard: %w", err)
	}
	return nil
}

// appliedMarker in the state directory records that the table was applied
// since boot.
const appliedMarker = "guard-table-applied"

func appliedBefore(cfg Config) bool {
	_, err := os.Stat(filepath.Join(cfg.stateDir(), appliedMarker))
	return err == nil
}

func markApplied(cfg Config) error {
	if appliedBefore(cfg) {
		return nil // a restart, or the next Start of the bench
	}
	if err := os.MkdirAll(cfg.stateDir(), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(cfg.stateDir(), appliedMarker), nil, 0o644)
}
