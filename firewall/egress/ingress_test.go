package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// addrLinks names index i "if<i>" and address a "held-<a>"; every index
// holds every loopback address.
type addrLinks struct{}

func (addrLinks) ByIndex(i int) (string, error) {
	return "if" + string(rune('0'+i)), nil
}

func (addrLinks) ByAddr(a netip.Addr) (string, error) {
	if !a.Is4() {
		return "", errors.New("not an IPv4 address")
	}
	return "held-" + a.String(), nil
}

func (addrLinks) Holds(_ int, a netip.Addr) (bool, error) { return a.IsLoopback(), nil }

// TestConnInterface: an accepted TCP connection is named by the interface
// its SYN came in on (here the loopback, whatever its local address), not
// by the holder of its local address; what is no TCP connection is not
// named at all.
func TestConnInterface(t *testing.T) {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal("no loopback interface:", err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := acceptDialed(t, ln, func(addr string) (net.Conn, error) { return net.Dial("tcp4", addr) })
	index, bound, err := ingressIndex(c)
	if err != nil || index != lo.Index || bound {
		t.Fatalf("ingressIndex = %d, %v, %v; want %d (lo), unbound", index, bound, err, lo.Index)
	}
	if got, err := ConnInterface(addrLinks{}, c); err != nil || got != "if"+string(rune('0'+lo.Index)) {
		t.Errorf("ConnInterface = %q, %v; want lo's index named", got, err)
	}
	p, q := net.Pipe()
	defer p.Close()
	defer q.Close()
	if got, err := ConnInterface(addrLinks{}, p); err == nil {
		t.Errorf("ConnInterface of a pipe = %q, want an error", got)
	}
}

// TestConnInterfaceErrorRefuses (review53b): a TCP connection whose
// ingress index cannot be read (here: closed, so its descriptor is gone)
// is refused, not named by its local address's holder, which may be
// another bridge sharing the address.
func TestConnInterfaceErrorRefuses(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := acceptDialed(t, ln, func(addr string) (net.Conn, error) { return net.Dial("tcp4", addr) })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := ConnInterface(addrLinks{}, c); err == nil {
		t.Errorf("ConnInterface of a connection whose index cannot be read = %q, want an error", got)
	}
}

// TestConnInterfaceIndexHoldsLocal (review53b): the ingress index names
// the connection only when its interface holds the connection's local
// address (the address the guard redirected the SYN to, on the SYN's
// bridge). A client behind bridge d1 of a node namespace connects to the
// address of bridge d0: the connection comes in on d1, which does not
// hold it, and is refused, where the index alone named d1 (and the
// address alone d0). Once d1 holds the address too (two bridges of one
// gateway) the same connection is d1's.
func TestConnInterfaceIndexHoldsLocal(t *testing.T) {
	node, client := testkit.NewNetNS(t, "connhold"), testkit.NewNetNS(t, "connholdc")
	d0 := node.Bridge(t, "d0", "10.99.0.1/24")
	d1 := node.Bridge(t, "d1", "10.98.0.1/24")
	node.IP(t, "link", "add", "p1", "type", "veth", "peer", "name", "c1", "netns", client.Name)
	node.IP(t, "link", "set", "p1", "master", "d1", "up")
	client.IP(t, "addr", "add", "10.98.0.2/24", "dev", "c1")
	client.IP(t, "link", "set", "c1", "up")
	client.IP(t, "route", "add", "default", "via", "10.98.0.1")
	links, err := NewNetlinkLinks(node.Handle())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(links.Close)
	ln := node.Listen(t, "tcp4", ":0")
	_, port, err := net.SplitHostPort(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	name := func(to string) (string, error) {
		t.Helper()
		d, err := client.DialContext(context.Background(), "tcp4", net.JoinHostPort(to, port))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		c, ok := <-accepted
		if !ok {
			t.Fatal("listener closed")
		}
		defer c.Close()
		return ConnInterface(links, c)
	}
	if got, err := name("10.98.0.1"); err != nil || got != "d1" {
		t.Errorf("a connection in on d1 to d1's address = %q, %v; want d1", got, err)
	}
	if got, err := name("10.99.0.1"); err == nil {
		t.Errorf("a connection in on d1 to d0's address = %q, want an error", got)
	}
	node.IP(t, "addr", "add", "10.99.0.1/32", "dev", "d1")
	if got, err := name("10.99.0.1"); err != nil || got != "d1" {
		t.Errorf("a connection in on d1 to the address d0 and d1 hold = %q, %v; want d1", got, err)
	}
	lo, err := node.Netlink().LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr("10.99.0.1")
	for _, tc := range []struct {
		name  string
		index int
		want  bool
	}{{"d0", d0.Attrs().Index, true}, {"d1", d1.Attrs().Index, true}, {"lo", lo.Attrs().Index, false}} {
		if got, err := links.Holds(tc.index, a); err != nil || got != tc.want {
			t.Errorf("Holds(%s, %s) = %v, %v; want %v", tc.name, a, got, err, tc.want)
		}
	}
}

// TestConnInterfaceBoundSocket: a connection accepted on a socket bound
// to a device (as one accepted in a VRF is: the kernel's index is then
// the VRF device's, not the guest bridge's) is named by the holder of its
// local address instead.
func TestConnInterfaceBoundSocket(t *testing.T) {
	n := testkit.NewNetNS(t, "connif")
	n.IP(t, "link", "set", "lo", "up")
	var ln net.Listener
	if err := n.Do(func() error {
		lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), "lo") }); err != nil {
				return err
			}
			return serr
		}}
		var err error
		ln, err = lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c := acceptDialed(t, ln, func(addr string) (net.Conn, error) { return n.DialContext(context.Background(), "tcp4", addr) })
	if _, bound, err := ingressIndex(c); err != nil || !bound {
		t.Fatalf("ingressIndex of a bound socket: bound %v, %v; want bound", bound, err)
	}
	if got, err := ConnInterface(addrLinks{}, c); err != nil || got != "held-127.0.0.1" {
		t.Errorf("ConnInterface of a bound socket = %q, %v; want its local address's holder", got, err)
	}
}

// acceptDialed dials ln with dial and returns the accepted side; both
// sides and ln are closed at the test's end.
func acceptDialed(t *testing.T, ln net.Listener, dial func(addr string) (net.Conn, error)) net.Conn {
	t.Helper()
	t.Cleanup(func() { ln.Close() })
	d, err := dial(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
