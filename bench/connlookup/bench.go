// Package connlookup measures how the daemon names the interface a guest's
// TCP connection came in on (whose egress policy and owner apply: the
// egress proxy and the resolver's TCP listener do it for every connection
// a guest opens, so a guest decides how often): egress.ConnInterface, the
// kernel's ingress index of the connection (IP_PKTOPTIONS), the check that
// its interface holds the local address and that index's name, against
// the former way, a dump of every IPv4 address of
// the node's namespace for the holder of the connection's local address,
// in one run, on a scratch node namespace with 100 and 2000 guest bridges
// (a node of many sandboxes: the scale section's sizes), each with its
// gateway address, and a guest namespace on the last bridge whose
// connection to that gateway both name.
//
// The bench command's connlookup section ([Section]) calls Run. It needs
// root.
package connlookup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

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
	Bridges       int
	Ingress, Dump time.Duration
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
	fmt.Fprintf(w, "%-8s %24s %22s %8s\n", "bridges", "ingress index (ours)", "address dump (before)", "ratio")
	for _, f := range figs {
		ratio := "-"
		if f.Ingress > 0 {
			ratio = fmt.Sprintf("%.1fx", float64(f.Dump)/float64(f.Ingress))
		}
		fmt.Fprintf(w, "%-8d %24s %22s %8s\n", f.Bridges, f.Ingress.Round(100*time.Nanosecond), f.Dump.Round(100*time.Nanosecond), ratio)
	}
}

// measure brings up a node namespace with n guest bridges and a guest on
// the last, and times both ways of naming the guest's connection.
func measure(ctx context.Context, n int, o Options) (Figure, error) {
	node, err := bench.NewNode()
	if err != nil {
		return Figure{}, err
	}
	defer node.Close()
	var gw netip.Addr
	var last netlink.Link
	for i := range n {
		name := fmt.Sprintf("vnl%d", i)
		if err := node.H.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			return Figure{}, fmt.Errorf("connlookup: bridge %s: %w", name, err)
		}
		if last, err = node.H.LinkByName(name); err != nil {
			return Figure{}, err
		}
		gw = netip.AddrFrom4([4]byte{10, byte(64 + i/250), byte(i % 250), 1})
		if err := node.H.AddrAdd(last, &netlink.Addr{IPNet: prefixNet(gw, 24)}); err != nil {
			return Figure{}, fmt.Errorf("connlookup: address of %s: %w", name, err)
		}
		if err := node.H.LinkSetUp(last); err != nil {
			return Figure{}, err
		}
		if ctx.Err() != nil {
			return Figure{}, ctx.Err()
		}
	}
	conn, stop, err := guestConn(ctx, node, last, gw)
	if err != nil {
		return Figure{}, err
	}
	defer stop()
	links, err := egress.NewNetlinkLinks(node.NS)
	if err != nil {
		return Figure{}, err
	}
	defer links.Close()
	local := netip.MustParseAddrPort(conn.LocalAddr().String()).Addr()
	want := last.Attrs().Name
	var ours, dumped []time.Duration
	for b := range 2 * o.Blocks {
		// ours, dump, dump, ours, ours, dump, ...
		mine := b%4 == 0 || b%4 == 3
		for range o.Rounds {
			start := time.Now()
			var name string
			var err error
			if mine {
				name, err = egress.ConnInterface(links, conn)
			} else {
				name, err = links.ByAddr(local) // the baseline: every IPv4 address dumped, the holder asked by index
			}
			d := time.Since(start)
			if err != nil || name != want {
				return Figure{}, fmt.Errorf("connlookup: %d bridges: the guest's connection named %q (%v), want %s", n, name, err, want)
			}
			if mine {
				ours = append(ours, d)
			} else {
				dumped = append(dumped, d)
			}
		}
		if ctx.Err() != nil {
			return Figure{}, ctx.Err()
		}
	}
	return Figure{Bridges: n, Ingress: bench.Median(ours), Dump: bench.Median(dumped)}, nil
}

func prefixNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}

// guestConn makes a guest namespace on bridge br (a veth, the guest's
// end at gw+1), listens on the node's gw and returns the node's side of
// a connection the guest opened to it; stop closes both and removes the
// guest namespace.
func guestConn(ctx context.Context, node *bench.Node, br netlink.Link, gw netip.Addr) (net.Conn, func(), error) {
	var b [2]byte
	_, _ = rand.Read(b[:])
	name := "pgc" + hex.EncodeToString(b[:])
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vh" + name[3:], MasterIndex: br.Attrs().Index}, PeerName: "vg" + name[3:]}
	if err := node.H.LinkAdd(veth); err != nil {
		return nil, nil, fmt.Errorf("connlookup: guest veth: %w", err)
	}
	if err := node.H.LinkSetUp(veth); err != nil {
		return nil, nil, err
	}
	type made struct {
		ns  netns.NsHandle
		err error
	}
	mk := make(chan made, 1)
	go func() {
		// a thread of its own that never leaves the guest's namespace
		runtime.LockOSThread()
		ns, err := netns.NewNamed(name)
		mk <- made{ns, err}
	}()
	m := <-mk
	if m.err != nil {
		return nil, nil, fmt.Errorf("connlookup: guest netns: %w", m.err)
	}
	gns := m.ns
	cleanup := func() { gns.Close(); _ = netns.DeleteNamed(name) }
	peer, err := node.H.LinkByName(veth.PeerName)
	if err == nil {
		err = node.H.LinkSetNsFd(peer, int(gns))
	}
	gh, herr := netlink.NewHandleAt(gns)
	if err == nil {
		err = herr
	}
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("connlookup: guest link: %w", err)
	}
	defer gh.Close()
	geth, err := gh.LinkByName(veth.PeerName)
	if err == nil {
		err = gh.AddrAdd(geth, &netlink.Addr{IPNet: prefixNet(gw.Next(), 24)})
	}
	if err == nil {
		err = gh.LinkSetUp(geth)
	}
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("connlookup: guest address: %w", err)
	}
	var ln net.Listener
	lerr := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(node.NS); err != nil {
			lerr <- err
			return
		}
		var err error
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(gw, 0).String())
		lerr <- err
	}()
	if err := <-lerr; err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("connlookup: listen: %w", err)
	}
	dialed := make(chan net.Conn, 1)
	derr := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(gns); err != nil {
			derr <- err
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp4", ln.Addr().String())
		if err != nil {
			derr <- err
			return
		}
		dialed <- c
	}()
	c, err := ln.Accept()
	ln.Close()
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("connlookup: accept: %w", err)
	}
	var g net.Conn
	select {
	case g = <-dialed:
	case err := <-derr:
		c.Close()
		cleanup()
		return nil, nil, fmt.Errorf("connlookup: dial from the guest: %w", err)
	}
	return c, func() { c.Close(); g.Close(); cleanup() }, nil
}
