package egress

import (
	"errors"
	"net"
	"net/netip"
	"testing"
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
		t.Skip("no loopback interface:", err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	index, bound, err := ingressIndex(c)
	if err != nil || index != lo.Index || bound {
		t.Fatalf("ingressIndex = %d, %v, %v; want %d (lo), unbound", index, bound, err, lo.Index)
	}
	if got, err := connInterface(addrLinks{}, c); err != nil || got != "if"+string(rune('0'+lo.Index)) {
		t.Errorf("connInterface = %q, %v; want lo's index named", got, err)
	}
	p, q := net.Pipe()
	defer p.Close()
	defer q.Close()
	if got, err := connInterface(addrLinks{}, p); err == nil {
		t.Errorf("connInterface of a pipe = %q, want an error", got)
	}
}
