package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// Options tunes a run.
type Options struct {
	// Sizes are the numbers of zone bridges (each with one guest port);
	// nil means 1, 500 and 2000.
	Sizes []int
	// Singles is how many new bridges are timed one at a time (default
	// 20); Burst how many appear at once (default 50); Changes how many
	// port moves, zone additions and lockdown flips are timed (default 20).
	Singles, Burst, Changes int
	// CPUProfile, when set, is where a CPU profile of the largest size's
	// burst of new bridges is written.
	CPUProfile string
	// Out gets the figures (nil: discarded).
	Out io.Writer
	// Log gets the guard's log (nil: discarded).
	Log *slog.Logger
}

// Goals at the largest size (issue 29).
const (
	GoalNewBridgeP99 = 50 * time.Millisecond
	GoalBurst        = 250 * time.Millisecond
	GoalLockdownP99  = 5 * time.Millisecond
)

// SizeResult holds the figures of one size.
type SizeResult struct {
	Bridges, Ports, Links int
	StartToReady          time.Duration
	NewBridge             []time.Duration // one at a time
	Early                 int             // single bridges whose pair preceded them (config read first)
	Burst                 time.Duration   // from the first bridge's creation until all are in their zone
	BurstSlowest          time.Duration   // the longest a bridge of the burst waited after its creation
	BurstMade             time.Duration   // the kernel's time to create the burst's bridges
	BurstEarly            int
	BurstSize             int
	PortMoved             []time.Duration
	ZoneAdded             []time.Duration
	Lockdown              []time.Duration
}

// Result holds every size, smallest first.
type Result struct{ Sizes []SizeResult }

func (o *Options) defaults() {
	if len(o.Sizes) == 0 {
		o.Sizes = []int{1, 500, 2000}
	}
	o.Sizes = slices.Sorted(slices.Values(o.Sizes))
	if o.Singles <= 0 {
		o.Singles = 20
	}
	if o.Burst <= 0 {
		o.Burst = 50
	}
	if o.Changes <= 0 {
		o.Changes = 20
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

// Run measures every size and prints the figures to o.Out.
func Run(ctx context.Context, o Options) (*Result, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("scale: needs root (network namespaces, nftables)")
	}
	o.defaults()
	res := &Result{}
	for i, n := range o.Sizes {
		profile := ""
		if i == len(o.Sizes)-1 {
			profile = o.CPUProfile
		}
		sr, err := runSize(ctx, o, n, profile)
		if err != nil {
			return nil, fmt.Errorf("scale: %d bridges: %w", n, err)
		}
		res.Sizes = append(res.Sizes, *sr)
		sr.print(o.Out)
	}
	res.printRatios(o.Out)
	return res, nil
}

// bed is one size's node with its guard and the names it created.
type bed struct {
	n     *node
	s     *stack
	ev    *events
	dir   string
	ports []firewall.Port
	next  int // next new bridge number
}

// wait bounds every single measurement.
const maxWait = 30 * time.Second

func runSize(ctx context.Context, o Options, size int, profile string) (*SizeResult, error) {
	b, sr, err := setUp(ctx, o, size)
	if err != nil {
		return nil, err
	}
	defer b.close()
	for range o.Singles {
		r, err := b.newBridges(ctx, 1)
		if err != nil {
			return nil, fmt.Errorf("new bridge: %w", err)
		}
		sr.NewBridge = append(sr.NewBridge, r.slowest)
		sr.Early += r.early
		time.Sleep(50 * time.Millisecond)
	}
	stopProfile, err := startProfile(profile)
	if err != nil {
		return nil, err
	}
	r, err := b.newBridges(ctx, o.Burst)
	stopProfile()
	if err != nil {
		return nil, fmt.Errorf("burst: %w", err)
	}
	sr.Burst, sr.BurstSlowest, sr.BurstMade, sr.BurstEarly = r.all, r.slowest, r.made, r.early
	sr.BurstSize = o.Burst
	if err := b.inForce(ctx, o.Singles+o.Burst); err != nil {
		return nil, err
	}
	if sr.PortMoved, err = b.movePorts(ctx, o.Changes); err != nil {
		return nil, fmt.Errorf("port moved: %w", err)
	}
	if sr.ZoneAdded, err = b.addZones(ctx, o.Changes); err != nil {
		return nil, fmt.Errorf("zone added: %w", err)
	}
	if sr.Lockdown, err = b.flips(ctx, o.Changes); err != nil {
		return nil, fmt.Errorf("lockdown flip: %w", err)
	}
	return sr, nil
}

func startProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// setUp builds the node with size zone bridges, a port on each, and
// starts the guard on it.
func setUp(ctx context.Context, o Options, size int) (*bed, *SizeResult, error) {
	n, err := newNode()
	if err != nil {
		return nil, nil, err
	}
	b := &bed{n: n}
	if b.dir, err = os.MkdirTemp("", "pve-inspect-bench-scale-"); err != nil {
		n.close()
		return nil, nil, err
	}
	sdn := map[string]string{}
	for i := range size {
		v := fmt.Sprintf("v%04d", i)
		if err := n.bridge(v, vnetAddr(16, i)); err != nil {
			b.close()
			return nil, nil, err
		}
		port := fmt.Sprintf("tap%di0", 1000+i)
		mac, err := n.port(port, fmt.Sprintf("tp%d", 1000+i), v)
		if err != nil {
			b.close()
			return nil, nil, err
		}
		ip := netip.AddrFrom4([4]byte{10, byte(16 + i/256), byte(i % 256), 100})
		b.ports = append(b.ports, firewall.Port{Name: port, MAC: mac, IPv4: []netip.Addr{ip}})
		sdn[v] = "z" + v[1:]
	}
	for j := range o.Changes {
		for _, side := range []string{"a", "b"} {
			if err := n.bridge(fmt.Sprintf("x%s%03d", side, j), ""); err != nil {
				b.close()
				return nil, nil, err
			}
		}
	}
	start := time.Now()
	if b.s, err = startStack(ctx, n, b.dir, sdn, b.ports, o.Log); err != nil {
		b.close()
		return nil, nil, fmt.Errorf("start: %w", err)
	}
	sr := &SizeResult{Bridges: size, Ports: size, StartToReady: time.Since(start)}
	links, _ := n.h.LinkList()
	sr.Links = len(links)
	if b.ev, err = newEvents(n.ns); err != nil {
		b.close()
		return nil, nil, err
	}
	return b, sr, nil
}

func (b *bed) close() {
	if b.ev != nil {
		b.ev.close()
	}
	if b.s != nil {
		b.s.stop()
	}
	b.n.close()
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// burst is what newBridges measured.
type burst struct {
	// all: from the kernel's creation of the first bridge until every
	// one is in its zone; slowest: the longest any bridge waited after
	// its own creation; made: the kernel's time to create them all.
	all, slowest, made time.Duration
	// early: bridges whose pair was in force before the bridge existed
	// (the running config was read first).
	early int
}

// newBridges adds count new vnets at once as pve-network's apply does:
// the running config first, then the bridges (created, addressed, up,
// one after another), and times them from the kernel's creation of each.
func (b *bed) newBridges(ctx context.Context, count int) (burst, error) {
	var keys [][]byte
	var vnets []string
	for range count {
		v := fmt.Sprintf("n%04d", b.next)
		b.next++
		vnets = append(vnets, v)
		keys = append(keys, pair(v, v))
	}
	if err := b.s.addSDN(vnets...); err != nil {
		return burst{}, err
	}
	done := b.ev.expect(true, keys...)
	created := make([]time.Time, count)
	for i, v := range vnets {
		var err error
		if created[i], err = b.n.timedBridge(v, vnetAddr(64, b.next-count+i)); err != nil {
			return burst{}, err
		}
	}
	var r burst
	r.made = time.Since(created[0])
	ts, err := done(ctx, maxWait)
	if err != nil {
		return burst{}, err
	}
	r.all = max(latest(ts).Sub(created[0]), 0)
	for i, t := range ts {
		d := t.Sub(created[i])
		if d < 0 {
			r.early++
		}
		r.slowest = max(r.slowest, d)
	}
	return r, nil
}

// inForce checks the guard after the new bridges: Verify finds nothing
// to repair and nft lists every new bridge in @zone_peers.
func (b *bed) inForce(ctx context.Context, added int) error {
	if err := b.s.g.Verify(ctx); err != nil {
		return fmt.Errorf("verify after the new bridges: %w", err)
	}
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", b.n.name, "nft", "list", "set", "inet", firewall.TableName, firewall.SetZonePeers).Output()
	if err != nil {
		return fmt.Errorf("nft list set: %w", err)
	}
	for i := range added {
		v := fmt.Sprintf("n%04d", i)
		if !strings.Contains(string(out), fmt.Sprintf("%q . %q", v, v)) {
			return fmt.Errorf("nft list set zone_peers lacks %s", v)
		}
	}
	return nil
}
