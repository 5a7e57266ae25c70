package lockdown

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sync/errgroup"

	"github.com/pve-inspect/pve-inspect/bench"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/lockdown"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// Section is the bench command's lockdown section: marker-to-enforced
// latency on the bed, probed from a guest: the event-driven controller,
// then (side by side in the same run) the reference design's trigger,
// a [Timer] with a 60 s period in front of the same controller (the
// reference's systemd timer without its 15 s accuracy slack). The
// reference's modelled figure is printed beside both.
func Section(ctx context.Context, cfg bench.Config) error {
	flips, baseFlips := 40, 6
	if cfg.Quick {
		flips, baseFlips = 6, 2
	}
	r, err := newRig(ctx)
	if err != nil {
		return err
	}
	defer r.close()
	ours, err := r.measure(ctx, nil, flips, 500*time.Millisecond)
	if err != nil {
		return fmt.Errorf("event-driven: %w", err)
	}
	fmt.Fprintf(cfg.Out, "event-driven controller: %d flips done; baseline: %d flips, up to %v each\n", flips, baseFlips, ReferencePeriod)
	timer := &Timer{Marker: r.marker, Target: filepath.Join(r.dir, "timer", filepath.Base(r.marker)), Period: ReferencePeriod}
	base, err := r.measure(ctx, timer, baseFlips, ReferencePeriod)
	if err != nil {
		return fmt.Errorf("60 s timer baseline: %w", err)
	}
	if err := WriteBenchReport(cfg.Out, ours, &base); err != nil {
		return err
	}
	fmt.Fprintln(cfg.Out, "probe: TCP connect guest -> 203.0.113.10:80, 300 ms timeout (a timeout is blocked), 3 agreeing probes in a row; latency is up to the start of the first of them")
	return lockdown.SetMarker(r.marker, false)
}

// rig is the section's bed: one guest, the host guard running in the
// node's namespace, and a scratch directory for the marker and the
// controller's files.
type rig struct {
	bed    *testvm.Bed
	guest  *testvm.Guest
	node   netns.NsHandle
	guard  *firewall.Guard
	dir    string
	marker string
	stop   func() error // ends the guard's Run
}

// newRig brings the bed up and starts the guard on it. The guard is told
// the guest's port (as the daemon tells it from the VM configuration):
// its layer-2 table drops every frame of a zone bridge's unmapped guest
// port, ARP included, and the guest would find no route to the internet
// host before any lockdown.
func newRig(ctx context.Context) (_ *rig, err error) {
	r := &rig{node: netns.None()}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.bed, r.guest, err = bench.OneGuestBed(ctx); err != nil {
		return nil, err
	}
	if r.node, err = netns.GetFromName(r.bed.NodeNS()); err != nil {
		return nil, fmt.Errorf("node namespace: %w", err)
	}
	if r.dir, err = os.MkdirTemp("", "pve-inspect-bench-lockdown-"); err != nil {
		return nil, err
	}
	r.marker = filepath.Join(r.dir, "inspect-proxmox-egress-lockdown")
	r.guard, err = firewall.New(firewall.Config{DnsmasqUser: "dnsmasq", ProcRoot: filepath.Join(r.dir, "proc"), StateDir: filepath.Join(r.dir, "guard"),
		Zones: map[string][]string{"zonea": {r.guest.VNet}}}, firewall.WithNetNS(r.node))
	if err != nil {
		return nil, err
	}
	port := firewall.Port{Name: firewall.PortNames(r.guest.VMID, 0)[0], MAC: r.guest.MAC, IPv4: []netip.Addr{r.guest.IPv4()}}
	if err := r.guard.SetPorts(ctx, []firewall.Port{port}); err != nil {
		return nil, fmt.Errorf("guard ports: %w", err)
	}
	if err := r.guard.Start(ctx); err != nil {
		return nil, fmt.Errorf("guard start: %w", err)
	}
	r.stop = run(ctx, r.guard.Run)
	return r, nil
}

// close stops the guard and tears everything down, in reverse order.
func (r *rig) close() {
	if r.stop != nil {
		_ = r.stop()
	}
	if r.guard != nil {
		r.guard.Close()
	}
	if r.dir != "" {
		_ = os.RemoveAll(r.dir)
	}
	if r.node.IsOpen() {
		r.node.Close()
	}
	if r.bed != nil {
		_ = r.bed.Close()
	}
}

// run starts fn in a goroutine of an errgroup; the returned stop cancels
// it, waits for it and returns its error.
func run(ctx context.Context, fn func(context.Context) error) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	var eg errgroup.Group
	eg.Go(func() error { return fn(ctx) })
	return func() error { cancel(); return eg.Wait() }
}

// measure runs a controller and flips the marker n times. With a timer
// the controller watches the timer's target and the timer mirrors the
// marker into it; without one the controller watches the marker itself.
func (r *rig) measure(ctx context.Context, timer *Timer, n int, jitter time.Duration) (BenchResult, error) {
	cmarker := r.marker
	if timer != nil {
		cmarker = timer.Target
		if err := os.MkdirAll(filepath.Dir(cmarker), 0o755); err != nil {
			return BenchResult{}, err
		}
	}
	c, err := lockdown.New(lockdown.Options{
		Marker: cmarker, Resolver: r.bed.ResolvConf(), BackupDir: filepath.Join(r.dir, "run"),
		StateFile: filepath.Join(r.dir, "run", "lockdown.json"), Guard: r.guard, Halter: benchHalter{},
		Reloader: lockdown.ProcSignaler{Matcher: lockdown.DnsmasqMatcher{Exe: "dnsmasq", CmdlineContains: []string{r.bed.ResolvConf()}}},
	})
	if err != nil {
		return BenchResult{}, err
	}
	stops := []func() error{run(ctx, c.Run)}
	if timer != nil {
		stops = append(stops, run(ctx, timer.Run))
	}
	res, err := Bench(ctx, BenchOptions{
		Flips:        n,
		SetMarker:    func(_ context.Context, on bool) error { return lockdown.SetMarker(r.marker, on) },
		Probe:        r.probe,
		FlipTimeout:  ReferenceWorstCase + 30*time.Second,
		SettleJitter: jitter,
	})
	for _, stop := range stops {
		err = errors.Join(err, stop())
	}
	return res, err
}

// probe is a TCP connect from the guest to the internet host. A timeout is
// blocked, a connection is open, anything else (a refusal means a route
// exists) is not a verdict.
func (r *rig) probe(context.Context) (bool, error) {
	var blocked bool
	err := r.bed.Do(r.guest.NS, func() error {
		c, err := net.DialTimeout("tcp", testvm.InternetAddr+":80", 300*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			blocked = true
			return nil
		}
		return err
	})
	return blocked, err
}

// benchHalter records nothing: a halt during the bench is a failed flip
// the probe reports anyway.
type benchHalter struct{}

func (benchHalter) Halt(context.Context, string) error { return nil }
