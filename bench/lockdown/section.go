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

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/lockdown"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// benchLockdown measures marker-to-enforced latency on the bed by probing
// egress from a guest: the event-driven controller, then (side by side in
// the same run) the same controller in poll-only mode with a 60 s period,
// which is the reference design's systemd timer without its 15 s accuracy
// slack. The reference's modelled figure is printed beside both.
func benchLockdown(ctx context.Context, cfg config) error {
	flips, baseFlips := 40, 6
	if cfg.quick {
		flips, baseFlips = 6, 2
	}
	b, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		return err
	}
	defer b.Close()
	v := testvm.VNet{Name: "vneta", Subnet: netip.MustParsePrefix("10.10.1.0/24"), Gateway: netip.MustParseAddr("10.10.1.1"),
		DHCPStart: netip.MustParseAddr("10.10.1.100"), DHCPEnd: netip.MustParseAddr("10.10.1.200"), SNAT: true}
	if err := b.AddZone(ctx, testvm.Zone{ID: "zonea", VNets: []testvm.VNet{v}}); err != nil {
		return err
	}
	guest, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 101, VNet: "vneta"})
	if err != nil {
		return err
	}
	node, err := netns.GetFromName(b.NodeNS())
	if err != nil {
		return err
	}
	defer node.Close()
	dir, err := os.MkdirTemp("", "pve-inspect-bench-lockdown-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	g, err := firewall.New(firewall.Config{DnsmasqUser: "dnsmasq", ProcRoot: filepath.Join(dir, "proc"), StateDir: filepath.Join(dir, "guard"),
		Zones: map[string][]string{"zonea": {"vneta"}}}, firewall.WithNetNS(node))
	if err != nil {
		return err
	}
	defer g.Close()
	if err := g.Start(ctx); err != nil {
		return err
	}
	gctx, gstop := context.WithCancel(ctx)
	gdone := make(chan error, 1)
	go func() { gdone <- g.Run(gctx) }()
	defer func() { gstop(); <-gdone }()

	marker := filepath.Join(dir, "inspect-proxmox-egress-lockdown")
	opts := func(pollOnly bool, reassert time.Duration) lockdown.Options {
		return lockdown.Options{
			Marker: marker, Resolver: b.ResolvConf(), BackupDir: filepath.Join(dir, "run"),
			StateFile: filepath.Join(dir, "run", "lockdown.json"), Reassert: reassert, PollOnly: pollOnly,
			Guard: g, Halter: benchHalter{},
			Reloader: lockdown.ProcSignaler{Matcher: lockdown.DnsmasqMatcher{Exe: "dnsmasq", CmdlineContains: []string{b.ResolvConf()}}},
		}
	}
	// The probe: a TCP connect from the guest to the internet host. A
	// timeout is blocked, a connection is open, anything else (a refusal
	// means a route exists) is not a verdict.
	probe := func(context.Context) (bool, error) {
		var blocked bool
		err := b.Do(guest.NS, func() error {
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
	measure := func(o lockdown.Options, n int, jitter time.Duration) (lockdown.BenchResult, error) {
		c, err := lockdown.New(o)
		if err != nil {
			return lockdown.BenchResult{}, err
		}
		cctx, cstop := context.WithCancel(ctx)
		cdone := make(chan error, 1)
		go func() { cdone <- c.Run(cctx) }()
		defer func() { cstop(); <-cdone }()
		return lockdown.Bench(ctx, lockdown.BenchOptions{
			Flips:        n,
			SetMarker:    func(_ context.Context, on bool) error { return lockdown.SetMarker(marker, on) },
			Probe:        probe,
			FlipTimeout:  lockdown.ReferenceWorstCase + 30*time.Second,
			SettleJitter: jitter,
		})
	}
	ours, err := measure(opts(false, lockdown.DefaultReassert), flips, 500*time.Millisecond)
	if err != nil {
		return fmt.Errorf("event-driven: %w", err)
	}
	fmt.Printf("event-driven controller: %d flips done; baseline: %d flips, up to %v each\n", flips, baseFlips, lockdown.ReferencePeriod)
	base, err := measure(opts(true, lockdown.ReferencePeriod), baseFlips, lockdown.ReferencePeriod)
	if err != nil {
		return fmt.Errorf("poll-only baseline: %w", err)
	}
	if err := lockdown.WriteBenchReport(os.Stdout, ours, &base); err != nil {
		return err
	}
	fmt.Println("probe: TCP connect guest -> 203.0.113.10:80, 300 ms timeout (a timeout is blocked), 3 agreeing probes in a row; latency is up to the start of the first of them")
	return lockdown.SetMarker(marker, false)
}

// benchHalter records nothing: a halt during the bench is a failed flip
// the probe reports anyway.
type benchHalter struct{}

func (benchHalter) Halt(context.Context, string) error { return nil }
