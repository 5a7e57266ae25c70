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

// addrLinks names index i "if<i>" and address a "held-<a>".
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
