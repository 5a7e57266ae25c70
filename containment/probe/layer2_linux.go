package probe

import (
	"fmt"
	"syscall"
)

// sendRaw sends frames as they are on the interface with index ifindex
// through an AF_PACKET socket (root or CAP_NET_RAW). The socket has
// protocol 0, so it receives nothing.
func sendRaw(ifindex int, frames [][]byte) error {
	fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	defer syscall.Close(fd)
	for _, f := range frames {
		to := &syscall.SockaddrLinklayer{Ifindex: ifindex, Halen: 6}
		copy(to.Addr[:], f[0:6])
		if err := syscall.Sendto(fd, f, 0, to); err != nil {
			return fmt.Errorf("sendto: %w", err)
		}
	}
	return nil
}
