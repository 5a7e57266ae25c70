package firewall

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// LearnedElement is one member of the learned sets: Port 0 is an address
// of @egress_learned4 (tcp 80/443 through the name check), any other port
// an address and port of @egress_learned_ports4 (a name:port entry).
// Expires is how long the kernel keeps it still.
type LearnedElement struct {
	Iface   string
	Addr    netip.Addr
	Port    uint16
	Expires time.Duration
}

// LearnedElements lists both learned sets as the kernel holds them (a
// daemon starting over the elements the last run learned counts them
// against their owners again).
func (g *Guard) LearnedElements(ctx context.Context) ([]LearnedElement, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.desired == nil {
		return nil, errors.New("learned elements: guard not started")
	}
	sets := newSetObjects(&nftables.Table{Name: TableName, Family: family}, g.desired)
	var out []LearnedElement
	for _, name := range []string{SetEgressLearned4, SetEgressLearnedPorts4} {
		els, err := g.conn.GetSetElements(sets[name])
		if err != nil {
			return nil, fmt.Errorf("learned elements: list %s: %w", name, err)
		}
		for _, e := range els {
			if l, ok := learnedElement(e.Key, name == SetEgressLearnedPorts4); ok {
				l.Expires = e.Expires
				if l.Expires == 0 {
					l.Expires = e.Timeout
				}
				out = append(out, l)
			}
		}
	}
	return out, nil
}

// learnedElement decodes a learned set's key: the padded interface name,
// the IPv4 address and, in the ports set, the port (two bytes, padded to
// four), as LearnOpen writes them.
func learnedElement(key []byte, ports bool) (LearnedElement, bool) {
	n := unix.IFNAMSIZ + 4
	if ports {
		n += 4
	}
	if len(key) != n {
		return LearnedElement{}, false
	}
	l := LearnedElement{Iface: string(bytes.TrimRight(key[:unix.IFNAMSIZ], "\x00"))}
	if l.Iface == "" {
		return LearnedElement{}, false
	}
	l.Addr, _ = netip.AddrFromSlice(key[unix.IFNAMSIZ : unix.IFNAMSIZ+4])
	if ports {
		l.Port = binary.BigEndian.Uint16(key[unix.IFNAMSIZ+4:])
		if l.Port == 0 {
			return LearnedElement{}, false
		}
	}
	return l, true
}
