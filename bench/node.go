package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// Node is a fresh named network namespace with the guard sections'
// interface set: eth0 (default route via 192.0.2.1), eth1 (spare uplink),
// stor0 (trusted), vnetA and vnetB (guest bridges). Close it.
type Node struct {
	// Name is the namespace's name (for `ip netns exec`).
	Name string
	// NS is the namespace, for firewall.WithNetNS.
	NS netns.NsHandle
	// H is a netlink handle inside it.
	H *netlink.Handle
}

// NewNode creates and wires a node namespace.
func NewNode() (*Node, error) {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	name := "pgb" + hex.EncodeToString(b)
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	ns, err := netns.NewNamed(name)
	serr := netns.Set(orig)
	orig.Close()
	if serr != nil {
		// this thread is stuck in the new namespace: let it die with us
		return nil, fmt.Errorf("bench: back to original netns: %w", serr)
	}
	runtime.UnlockOSThread()
	if err != nil {
		return nil, fmt.Errorf("bench: create netns: %w", err)
	}
	n := &Node{Name: name, NS: ns}
	if n.H, err = netlink.NewHandleAt(ns); err != nil {
		n.Close()
		return nil, err
	}
	if err := n.setup(); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

func (n *Node) setup() error {
	lo, err := n.H.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := n.H.LinkSetUp(lo); err != nil {
		return err
	}
	for _, l := range []struct{ name, addr string }{
		{"eth0", "192.0.2.2/24"}, {"eth1", "198.51.100.2/24"}, {"stor0", "10.99.0.2/24"},
		{"vnetA", "10.10.1.1/24"}, {"vnetB", "10.10.2.1/24"},
	} {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: l.name}}
		if err := n.H.LinkAdd(br); err != nil {
			return fmt.Errorf("bench: add %s: %w", l.name, err)
		}
		if err := n.H.LinkSetUp(br); err != nil {
			return err
		}
		a, _ := netlink.ParseAddr(l.addr)
		if err := n.H.AddrAdd(br, a); err != nil {
			return err
		}
	}
	return n.DefaultVia("eth0", "192.0.2.1")
}

// DefaultVia points the default route through gw on dev.
func (n *Node) DefaultVia(dev, gw string) error {
	l, err := n.H.LinkByName(dev)
	if err != nil {
		return err
	}
	return n.H.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(gw),
		Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}})
}

// DropTables deletes the guard's (orphaned) inet and bridge tables so the
// next Start creates them.
func (n *Node) DropTables(ctx context.Context) error {
	for _, fam := range []string{"inet", "bridge"} {
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", n.Name, "nft", "delete", "table", fam, firewall.TableName).CombinedOutput()
		if err != nil {
			return fmt.Errorf("bench: delete table %s: %v: %s", fam, err, out)
		}
	}
	return nil
}

// Close deletes the namespace.
func (n *Node) Close() {
	if n.H != nil {
		n.H.Close()
	}
	n.NS.Close()
	_ = netns.DeleteNamed(n.Name)
}

// GuardConfig is the guard configuration of the guard sections: stor0
// trusted, no dnsmasq user on the node, state under dir.
func GuardConfig(dir string) firewall.Config {
	return firewall.Config{Trusted: []string{"stor0"}, DnsmasqUser: "65534",
		ProcRoot: "/nonexistent/pve-inspect-bench-proc", StateDir: dir}
}
