package scale

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"runtime"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// node is the bench's node namespace: eth0 (the uplink, default route),
// spare0 (a bridge of no zone), and the zone bridges with their ports.
type node struct {
	name string
	ns   netns.NsHandle
	h    *netlink.Handle
}

// newNode creates a named namespace with lo up. The namespace is created
// on a locked thread that is never unlocked, so that thread ends with its
// goroutine and nothing else ever runs in the wrong namespace.
func newNode() (*node, error) {
	var b [2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	n := &node{name: "pscale" + hex.EncodeToString(b[:])}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := netns.NewNamed(n.name)
		n.ns = ns
		errc <- err
	}()
	if err := <-errc; err != nil {
		return nil, fmt.Errorf("scale: create netns %s: %w", n.name, err)
	}
	var err error
	if n.h, err = netlink.NewHandleAt(n.ns); err != nil {
		n.close()
		return nil, fmt.Errorf("scale: netlink handle: %w", err)
	}
	lo, err := n.h.LinkByName("lo")
	if err == nil {
		err = n.h.LinkSetUp(lo)
	}
	if err == nil {
		err = n.bridge("eth0", "192.0.2.2/24")
	}
	if err == nil {
		err = n.bridge("spare0", "")
	}
	if err == nil {
		var l netlink.Link
		if l, err = n.h.LinkByName("eth0"); err == nil {
			err = n.h.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP("192.0.2.1"),
				Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}})
		}
	}
	if err != nil {
		n.close()
		return nil, fmt.Errorf("scale: node %s: %w", n.name, err)
	}
	return n, nil
}

// bridge adds an up bridge with addr (CIDR, "" for none), as a vnet with
// its gateway address comes up.
func (n *node) bridge(name, addr string) error {
	_, err := n.timedBridge(name, addr)
	return err
}

// timedBridge is bridge; it returns when the kernel had created the
// link (before its address and up).
func (n *node) timedBridge(name, addr string) (time.Time, error) {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := n.h.LinkAdd(br); err != nil {
		return time.Time{}, fmt.Errorf("add bridge %s: %w", name, err)
	}
	created := time.Now()
	return created, n.bridgeUp(br, name, addr)
}

func (n *node) bridgeUp(br *netlink.Bridge, name, addr string) error {
	if addr != "" {
		a, err := netlink.ParseAddr(addr)
		if err != nil {
			return err
		}
		if err := n.h.AddrAdd(br, a); err != nil {
			return fmt.Errorf("address %s on %s: %w", addr, name, err)
		}
	}
	if err := n.h.LinkSetUp(br); err != nil {
		return fmt.Errorf("up %s: %w", name, err)
	}
	return nil
}

// port adds a veth pair, port (a guest port name) enslaved to bridge and
// peer left alone, both up.
func (n *node) port(port, peer, bridge string) (net.HardwareAddr, error) {
	br, err := n.h.LinkByName(bridge)
	if err != nil {
		return nil, err
	}
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port, MasterIndex: br.Attrs().Index}, PeerName: peer}
	if err := n.h.LinkAdd(v); err != nil {
		return nil, fmt.Errorf("add port %s: %w", port, err)
	}
	l, err := n.h.LinkByName(port)
	if err != nil {
		return nil, err
	}
	if err := n.h.LinkSetUp(l); err != nil {
		return nil, err
	}
	return l.Attrs().HardwareAddr, nil
}

// move enslaves port to bridge.
func (n *node) move(port, bridge string) error {
	p, err := n.h.LinkByName(port)
	if err != nil {
		return err
	}
	br, err := n.h.LinkByName(bridge)
	if err != nil {
		return err
	}
	return n.h.LinkSetMaster(p, br)
}

func (n *node) close() {
	if n.h != nil {
		n.h.Close()
	}
	n.ns.Close()
	_ = netns.DeleteNamed(n.name)
}

// vnetAddr is the gateway address of zone bridge i (10.16.0.1/24 on).
func vnetAddr(base, i int) string {
	return fmt.Sprintf("10.%d.%d.1/24", base+i/256, i%256)
}
