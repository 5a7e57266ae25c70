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
// proxy or the resolver's TCP listener) came in on: the interface the
// kernel received its first segment on (ingressIndex), whose policy and
// owner apply.
//
// Not its local address's holder: the guard's redirect makes the local
// address the first address of the bridge the connection came in on, and
// two bridges may hold one address (two zones of one gateway: Proxmox
// allows one range in two zones, and a tenant with SDN rights can make one
// beside a sandbox's), so by address every connection to it was one
// bridge's, the other's guests under its policy, quota and record. The
// holder of the local address (Links.ByAddr) is asked only where the
// kernel's index is not the guest interface's: a connection accepted in a
// VRF (the socket is bound to it, tcp_l3mdev_accept; the index recorded is
// the VRF device's), or c is no TCP socket.
func ConnInterface(links Links, c net.Conn) (string, error) {
	index, bound, err := ingressIndex(c)
	if err == nil && index > 0 && !bound {
		return links.ByIndex(index)
	}
	la, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return "", errors.New("egress: not a TCP connection")
	}
	a, _ := netip.AddrFromSlice(la.IP)
	return links.ByAddr(a.Unmap())
}

// ingressIndex returns the index of the interface accepted TCP connection
// c came in on and whether c is bound to a device. The kernel keeps the
// index of the SYN's interface on the connection's socket
// (tcp_v4_syn_recv_sock: inet->mc_index = inet_iif(skb)) and hands it out
// as IP_PKTOPTIONS' IP_PKTINFO once IP_PKTINFO is on (set here, on the
// accepted socket: the index is kept whether or not it was on at the
// SYN).
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
