package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ConnInterface names the interface guest connection c (accepted by the
// proxy or the resolver's TCP listener) came in on: the interface of the
// kernel's ingress index of c (ingressIndex), whose policy and owner
// apply, once that interface is seen to hold c's local address.
//
// Not its local address's holder alone: the guard's redirect makes the
// local address the first address of the bridge the SYN came in on, and
// two bridges may hold one address (two zones of one gateway: Proxmox
// allows one range in two zones, and a tenant with SDN rights can make one
// beside a sandbox's), so by address every connection to it was one
// bridge's, the other's guests under its policy, quota and record.
//
// Not the index alone either (review53b): the index is that of the
// segment that completed the handshake, the ACK (tcp_check_req and, for
// a SYN cookie, cookie_v4_check hand it to syn_recv_sock), not the SYN's,
// and a request socket of an unbound listener takes its ACK from any
// interface. The redirect is conntrack's, so an ACK with the connection's
// 4-tuple that reaches the node through another interface (another
// zone's VXLAN or VLAN uplink port, which the layer-2 table does not pin;
// a Proxmox VE node's source check is loose at most: pve-firewall's
// /usr/lib/sysctl.d/pve-firewall.conf sets all.rp_filter 2, which passes
// a source routed through any interface, and pve-docs asks EVPN exit
// nodes for 0) is redirected and delivered the
// same, and named the connection after that interface
// (TestHandshakeACKElsewhereOnBed). The interface the SYN came in on
// holds the local address, so an index whose interface does not
// (Links.Holds) is refused.
//
// In front of this, the guard (firewall, egress-rpf-* in guest_in) drops
// every packet to the resolver's and the proxy's ports whose source
// address does not route back through the interface it came in on (fib
// saddr . iif oif missing), before conntrack's established flows are
// accepted: such an ACK, and a UDP query (named by its IP_PKTINFO
// index, TestQueryElsewhereOnBed), carrying a zonea guest's address
// never reaches the daemon through zoneb's bridge. Left: two bridges
// holding one IPv4 subnet cannot be told apart by the source. The lookup
// finds one bridge's route: the guard drops the other bridge's guests
// (the node routes them no answer anyway), and a packet carrying one of
// them through the first bridge's uplink port passes as that bridge's.
// A source of a bridge's own subnet through its uplink port is the
// zone's own segment and passes too.
//
// The holder of the local address (Links.ByAddr) is asked only where the
// kernel's index is not the guest interface's: a connection accepted in a
// VRF (the socket is bound to it, tcp_l3mdev_accept; the index recorded is
// the VRF device's), or c is no *net.TCPConn. A TCP connection whose index
// cannot be read, or is none, is refused: its local address may be
// another bridge's too.
func ConnInterface(links Links, c net.Conn) (string, error) {
	la, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return "", errors.New("egress: not a TCP connection")
	}
	local, _ := netip.AddrFromSlice(la.IP)
	local = local.Unmap()
	if _, ok := c.(*net.TCPConn); ok {
		index, bound, err := ingressIndex(c)
		switch {
		case err != nil:
			return "", fmt.Errorf("egress: ingress interface: %w", err)
		case !bound && index <= 0:
			return "", fmt.Errorf("egress: no ingress interface (index %d)", index)
		case !bound:
			held, err := links.Holds(index, local)
			if err != nil {
				return "", err
			}
			if !held {
				return "", fmt.Errorf("egress: ingress interface %d does not hold %s, the address the connection was redirected to", index, local)
			}
			return links.ByIndex(index)
		}
	}
	return links.ByAddr(local)
}

// ingressIndex returns the index of the interface accepted TCP connection
// c came in on and whether c is bound to a device. The kernel keeps the
// index of the interface of the segment it made the connection's socket
// on (tcp_v4_syn_recv_sock: inet->mc_index = inet_iif(skb)): the ACK
// that completed the handshake, or the SYN under TCP Fast Open. It hands
// it out as IP_PKTOPTIONS' IP_PKTINFO once IP_PKTINFO is on (set here, on
// the accepted socket: the index is kept whether or not it was on then).
func ingressIndex(c net.Conn) (index int, bound bool, err error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return 0, false, errors.New("not a TCP connection")
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0, false, err
	}
	var opts []byte
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1); serr != nil {
			return
		}
		var dev int
		if dev, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BINDTOIFINDEX); serr != nil {
			return
		}
		bound = dev != 0
		opts, serr = pktOptions(int(fd))
	}); err != nil {
		return 0, false, err
	}
	if serr != nil {
		return 0, false, serr
	}
	msgs, err := unix.ParseSocketControlMessage(opts)
	if err != nil {
		return 0, false, fmt.Errorf("IP_PKTOPTIONS: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo {
			// struct in_pktinfo: ipi_ifindex (int) first
			return int(int32(binary.NativeEndian.Uint32(m.Data[:4]))), bound, nil
		}
	}
	return 0, bound, errors.New("IP_PKTOPTIONS: no IP_PKTINFO")
}

// pktOptions returns IP_PKTOPTIONS of TCP socket fd (control messages;
// x/sys/unix has no getsockopt of a byte buffer).
func pktOptions(fd int) ([]byte, error) {
	var buf [64]byte
	n := uint32(len(buf))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_IP, unix.IP_PKTOPTIONS,
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return nil, fmt.Errorf("IP_PKTOPTIONS: %w", e)
	}
	return buf[:min(int(n), len(buf))], nil
}
