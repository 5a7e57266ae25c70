// Package connlookup measures how the daemon names the interface a guest's
// connection came in on (the egress proxy and the resolver's TCP listener
// do it for every connection a guest opens, so a guest decides how often):
// egress.NetlinkLinks.ByAddr, the local route of the connection's local
// address (one RTM_GETROUTE with RTM_F_FIB_MATCH), against the former way,
// a dump of every IPv4 address of the node's namespace, in one run, on a
// scratch node namespace with 100 and 2000 guest bridges (a node of many
// sandboxes: the scale section's sizes), each with its gateway address.
//
// The bench command's connlookup section ([Section]) calls Run. It needs
// root.
package connlookup

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/pve-inspect/pve-inspect/bench"
	"github.com/pve-inspect/pve-inspect/firewall/egress"
)

// Options tunes a run.
type Options struct {
	// Bridges are the node's guest bridge counts measured [100, 2000].
	Bridges []int
	// Rounds is the look-ups of each way per block [200]; Blocks the
	// blocks of each way, alternated so that the machine's load weighs on
	// both alike [4].
	Rounds, Blocks int
}

// Figure is one bridge count's median look-up, ours and the dump's.
type Figure struct {
	Bridges     int
	Route, Dump time.Duration
}

// Run measures each bridge count of o and prints the figures to w.
func Run(ctx context.Context, o Options, w io.Writer) ([]Figure, error) {
	if len(o.Bridges) == 0 {
		o.Bridges = []int{100, 2000}
	}
	if o.Rounds <= 0 {
		o.Rounds = 200
	}
	if o.Blocks <= 0 {
		o.Blocks = 4
	}
	var out []Figure
	for _, n := range o.Bridges {
		f, err := measure(ctx, n, o)
		if err != nil {
			return out, err
		}
		out = append(out, f)
	}
	Print(w, out)
	return out, nil
}

// Print writes the figures as the README quotes them.
func Print(w io.Writer, figs []Figure) {
	fmt.Fprintf(w, "%-8s %22s %22s %8s\n", "bridges", "local route (ours)", "address dump (before)", "ratio")
	for _, f := range figs {
		ratio := "-"
		if f.Route > 0 {
			ratio = fmt.Sprintf("%.1fx", float64(f.Dump)/float64(f.Route))
		}
		fmt.Fprintf(w, "%-8d %22s %22s %8s\n", f.Bridges, f.Route.Round(100*time.Nanosecond), f.Dump.Round(100*time.Nanosecond), ratio)
	}
}

// measure brings up a node namespace with n guest bridges and times
// both ways of naming the last bridge's gateway address (the dump reads
// every address whichever is asked).
func measure(ctx context.Context, n int, o Options) (Figure, error) {
	node, err := bench.NewNode()
	if err != nil {
		return Figure{}, err
	}
	defer node.Close()
	var last netip.Addr
	var lastName string
	for i := range n {
		name := fmt.Sprintf("vnl%d", i)
		if err := node.H.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			return Figure{}, fmt.Errorf("connlookup: bridge %s: %w", name, err)
		}
		l, err := node.H.LinkByName(name)
		if err != nil {
			return Figure{}, err
		}
		last = netip.AddrFrom4([4]byte{10, byte(64 + i/250), byte(i % 250), 1})
		lastName = name
		a, err := netlink.ParseAddr(last.String() + "/24")
		if err != nil {
			return Figure{}, err
		}
		if err := node.H.AddrAdd(l, a); err != nil {
			return Figure{}, fmt.Errorf("connlookup: address of %s: %w", name, err)
		}
		if err := node.H.LinkSetUp(l); err != nil {
			return Figure{}, err
		}
		if ctx.Err() != nil {
			return Figure{}, ctx.Err()
		}
	}
	links, err := egress.NewNetlinkLinks(node.NS)
	if err != nil {
		return Figure{}, err
	}
	defer links.Close()
	dump := dumpLinks{h: node.H}
	var route, dumped []time.Duration
	for b := range 2 * o.Blocks {
		// route, dump, dump, route, route, dump, ...
		ours := b%4 == 0 || b%4 == 3
		for range o.Rounds {
			start := time.Now()
			var name string
			var err error
			if ours {
				name, err = links.ByAddr(last)
			} else {
				name, err = dump.byAddr(last)
			}
			d := time.Since(start)
			if err != nil || name != lastName {
				return Figure{}, fmt.Errorf("connlookup: %d bridges: %s named %q (%v), want %s", n, last, name, err, lastName)
			}
			if ours {
				route = append(route, d)
			} else {
				dumped = append(dumped, d)
			}
		}
		if ctx.Err() != nil {
			return Figure{}, ctx.Err()
		}
	}
	return Figure{Bridges: n, Route: bench.Median(route), Dump: bench.Median(dumped)}, nil
}

// dumpLinks is the baseline, the daemon's look-up before: every IPv4
// address of the namespace dumped, the holder's name asked by index.
type dumpLinks struct{ h *netlink.Handle }

func (d dumpLinks) byAddr(a netip.Addr) (string, error) {
	addrs, err := d.h.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return "", err
	}
	for _, ad := range addrs {
		if got, ok := netip.AddrFromSlice(ad.IP.To4()); ok && got == a {
			l, err := d.h.LinkByIndex(ad.LinkIndex)
			if err != nil {
				return "", err
			}
			return l.Attrs().Name, nil
		}
	}
	return "", fmt.Errorf("no interface holds %s", a)
}
