// Package layer2 measures the host guard's layer-2 table (the bridge
// table pinning each guest port's MAC and addresses) against the same guard
// whose layer-2 table guards no port, both variants interleaved in one run
// on one fresh namespace with Ports veth guest ports on one bridge: the
// guard apply, a one-port move (SetPorts) and a zone update (SetZones)
// beside the port map. The bench command's layer2 section ([Section])
// calls RunLayer2. It needs root and nft.
package layer2

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/pve-inspect/pve-inspect/bench"
	"github.com/pve-inspect/pve-inspect/firewall"
)

// Layer2Options tunes the layer-2 run.
type Layer2Options struct {
	// Ports is how many guest ports the zone bridge has; 0 means 500.
	Ports int
	// Rounds is how many applies each variant gets (median); 0 means 5.
	Rounds int
	// Updates is how many one-port updates each variant gets; 0 means 50.
	Updates int
}

// Layer2Result holds medians of one layer-2 run. "With" is the guard with
// its layer-2 table pinning Ports guest ports; "without" is the same guard
// and node whose layer-2 table guards no port (no zone bridge, empty map):
// the guard as it was before the layer-2 table, plus an empty table.
type Layer2Result struct {
	Ports                     int
	ApplyWith, ApplyWithout   time.Duration // Start: one batch (both tables) + verify
	UpdateWith, UpdateWithout time.Duration // SetPorts moving one port to a new address
	ZonesWith, ZonesWithout   time.Duration // SetZones (an inet-table update) beside the map
	Rounds, Updates           int
}

// Print writes the figures.
func (r Layer2Result) Print(w io.Writer) {
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(b) }
	fmt.Fprintf(w, "guard apply with the layer-2 table at %d guest ports, median of %d: %v\n", r.Ports, r.Rounds, r.ApplyWith)
	fmt.Fprintf(w, "guard apply without guest ports (empty layer-2 table), median of %d: %v\n", r.Rounds, r.ApplyWithout)
	fmt.Fprintf(w, "ratio with/without: %.2fx\n", ratio(r.ApplyWith, r.ApplyWithout))
	fmt.Fprintf(w, "one-port update (SetPorts, new address) at %d mapped ports, median of %d: %v\n", r.Ports, r.Updates, r.UpdateWith)
	fmt.Fprintf(w, "one-port update at 1 mapped port, median of %d: %v\n", r.Updates, r.UpdateWithout)
	fmt.Fprintf(w, "ratio with/without: %.2fx\n", ratio(r.UpdateWith, r.UpdateWithout))
	fmt.Fprintf(w, "zone update (SetZones) beside %d mapped ports, median of %d: %v\n", r.Ports, r.Updates, r.ZonesWith)
	fmt.Fprintf(w, "zone update with no port mapped, median of %d: %v\n", r.Updates, r.ZonesWithout)
	fmt.Fprintf(w, "ratio with/without: %.2fx\n", ratio(r.ZonesWith, r.ZonesWithout))
}

// RunLayer2 measures the layer-2 table's cost, both variants in the same
// run on one fresh namespace with Ports veth guest ports on vnetA.
func RunLayer2(ctx context.Context, o Layer2Options, w io.Writer) (*Layer2Result, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("bench: needs root (network namespaces, nftables)")
	}
	if o.Ports <= 0 {
		o.Ports = 500
	}
	if o.Rounds <= 0 {
		o.Rounds = 5
	}
	if o.Updates <= 0 {
		o.Updates = 50
	}
	n, err := bench.NewNode()
	if err != nil {
		return nil, err
	}
	defer n.Close()
	ports, err := guestPorts(n, o.Ports)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pve-inspect-bench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	r := &Layer2Result{Ports: o.Ports, Rounds: o.Rounds, Updates: o.Updates}
	with := func() firewall.Config {
		c := bench.GuardConfig(dir)
		c.Zones = map[string][]string{"zonea": {"vnetA"}}
		return c
	}
	variants := []struct {
		cfg            firewall.Config
		ports          []firewall.Port
		apply, upd, zn *time.Duration
	}{
		{with(), ports, &r.ApplyWith, &r.UpdateWith, &r.ZonesWith},
		{bench.GuardConfig(dir), ports[:1], &r.ApplyWithout, &r.UpdateWithout, &r.ZonesWithout},
	}
	var applies [2][]time.Duration
	for round := 0; round < o.Rounds; round++ {
		for i, v := range variants { // interleaved, so load hits both alike
			d, err := timeApply(ctx, n, v.cfg, v.ports, i == 0 && round == 0, o.Ports)
			if err != nil {
				return nil, err
			}
			applies[i] = append(applies[i], d)
		}
	}
	for i, v := range variants {
		*v.apply = bench.Median(applies[i])
		u, z, err := timeUpdates(ctx, n, v.cfg, v.ports, o.Updates)
		if err != nil {
			return nil, err
		}
		*v.upd, *v.zn = u, z
	}
	r.Print(w)
	return r, nil
}

// guestPorts adds count veth pairs whose tap<id>i0 end is a port of vnetA
// and returns their port map (MAC, an address in 10.10.0.0/16).
func guestPorts(n *bench.Node, count int) ([]firewall.Port, error) {
	br, err := n.H.LinkByName("vnetA")
	if err != nil {
		return nil, err
	}
	var out []firewall.Port
	for i := 0; i < count; i++ {
		vmid := 1000 + i
		name := firewall.PortNames(vmid, 0)[0]
		mac := net.HardwareAddr{0xbc, 0x24, 0x11, 0, byte(i >> 8), byte(i)}
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MasterIndex: br.Attrs().Index}, PeerName: fmt.Sprintf("p%d", vmid), PeerHardwareAddr: mac}
		if err := n.H.LinkAdd(v); err != nil {
			return nil, fmt.Errorf("bench: add %s: %w", name, err)
		}
		out = append(out, firewall.Port{Name: name, MAC: mac, IPv4: []netip.Addr{netip.AddrFrom4([4]byte{10, 10, byte(2 + i/250), byte(1 + i%250)})}})
	}
	return out, nil
}

// timeApply starts a guard on a namespace without our tables and returns
// how long Start took; it leaves no table behind.
func timeApply(ctx context.Context, n *bench.Node, cfg firewall.Config, ports []firewall.Port, check bool, want int) (time.Duration, error) {
	g, err := firewall.New(cfg, firewall.WithNetNS(n.NS))
	if err != nil {
		return 0, err
	}
	if err := g.SetPorts(ctx, ports); err != nil {
		g.Close()
		return 0, err
	}
	start := time.Now()
	err = g.Start(ctx)
	d := time.Since(start)
	if err == nil && check {
		if got := len(g.BridgeDesired().Set(firewall.SetGuestPorts).Elements); got != want {
			err = fmt.Errorf("bench: %d guest ports in the layer-2 table, want %d", got, want)
		}
	}
	g.Close()
	if err != nil {
		return 0, fmt.Errorf("bench: guard start: %w", err)
	}
	return d, n.DropTables(ctx)
}

// timeUpdates starts a guard and times one-port moves and zone updates.
func timeUpdates(ctx context.Context, n *bench.Node, cfg firewall.Config, ports []firewall.Port, count int) (upd, zones time.Duration, err error) {
	g, err := firewall.New(cfg, firewall.WithNetNS(n.NS))
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		g.Close()
		if derr := n.DropTables(ctx); err == nil {
			err = derr
		}
	}()
	if err := g.SetPorts(ctx, ports); err != nil {
		return 0, 0, err
	}
	if err := g.Start(ctx); err != nil {
		return 0, 0, err
	}
	var us, zs []time.Duration
	cur := append([]firewall.Port(nil), ports...)
	for i := 0; i < count; i++ {
		p := cur[i%len(cur)]
		p.IPv4 = []netip.Addr{netip.AddrFrom4([4]byte{10, 11, byte(i >> 8), byte(1 + i%250)})}
		cur[i%len(cur)] = p
		start := time.Now()
		if err := g.SetPorts(ctx, cur); err != nil {
			return 0, 0, err
		}
		us = append(us, time.Since(start))
		zone := map[string][]string{"extra": {fmt.Sprintf("vnetX%d", i%2)}}
		start = time.Now()
		if err := g.SetZones(ctx, zone); err != nil {
			return 0, 0, err
		}
		zs = append(zs, time.Since(start))
	}
	if err := g.Verify(ctx); err != nil {
		return 0, 0, fmt.Errorf("bench: after the updates: %w", err)
	}
	return bench.Median(us), bench.Median(zs), nil
}
