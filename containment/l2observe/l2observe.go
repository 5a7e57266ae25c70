package l2observe

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// DefaultLinger is how long a watch goes on after the watched work ends.
const DefaultLinger = 500 * time.Millisecond

// maxNonces bounds the nonces of one query.
const maxNonces = 64

// Query says where to watch and what to look for.
type Query struct {
	// Bridge is the zone's bridge device.
	Bridge string
	// Exclude are ports of Bridge not watched: the probing guest's own.
	Exclude []string
	// Nonces are byte strings looked for anywhere in every frame (at
	// least 8 bytes each).
	Nonces [][]byte
	// Gateway, when valid (IPv4), records ARP frames whose sender
	// address is Gateway and whose sender MAC is not the bridge's.
	Gateway netip.Addr
	// Linger is how long to keep watching after the work ends; 0 = DefaultLinger.
	Linger time.Duration
}

func (q Query) validate() error {
	if q.Bridge == "" || len(q.Bridge) > 15 {
		return fmt.Errorf("l2observe: bridge %q: want an interface name", q.Bridge)
	}
	if len(q.Nonces) > maxNonces {
		return fmt.Errorf("l2observe: %d nonces, at most %d", len(q.Nonces), maxNonces)
	}
	for _, n := range q.Nonces {
		if len(n) < 8 {
			return fmt.Errorf("l2observe: nonce %x: want at least 8 bytes", n)
		}
	}
	if q.Gateway.IsValid() && !q.Gateway.Is4() {
		return fmt.Errorf("l2observe: gateway %s: want IPv4", q.Gateway)
	}
	if len(q.Nonces) == 0 && !q.Gateway.IsValid() {
		return errors.New("l2observe: nothing to look for")
	}
	return nil
}

// Claim is an ARP frame that claimed the gateway's address.
type Claim struct {
	Iface string `json:"iface"` // where it was seen
	MAC   string `json:"mac"`   // the sender MAC it claimed the address for
}

// Sightings are what a watch recorded.
type Sightings struct {
	// Bridge is the bridge device watched.
	Bridge string `json:"bridge"`
	// Ports are the other ports of the bridge watched, sorted.
	Ports []string `json:"ports"`
	// Nonces maps a nonce (lowercase hex) to the interfaces it was seen
	// on, sorted; a nonce seen nowhere has no entry.
	Nonces map[string][]string `json:"nonces"`
	// GatewayClaims are the ARP claims of the gateway's address, by
	// interface and MAC, sorted.
	GatewayClaims []Claim `json:"gateway_claims"`
}

// SeenOn returns the interfaces nonce was seen on.
func (s *Sightings) SeenOn(nonce []byte) []string {
	return s.Nonces[hex.EncodeToString(nonce)]
}

// recorder matches frames against a query; safe for concurrent use.
type recorder struct {
	q         Query
	bridgeMAC net.HardwareAddr

	mu  sync.Mutex // guards out
	out Sightings
}

func newRecorder(q Query, bridgeMAC net.HardwareAddr, ports []string) *recorder {
	ports = slices.Clone(ports)
	slices.Sort(ports)
	return &recorder{q: q, bridgeMAC: bridgeMAC,
		out: Sightings{Bridge: q.Bridge, Ports: ports, Nonces: map[string][]string{}}}
}

// record matches one frame seen on iface.
func (r *recorder) record(iface string, frame []byte) {
	for _, n := range r.q.Nonces {
		if bytes.Contains(frame, n) {
			r.add(func(s *Sightings) {
				k := hex.EncodeToString(n)
				if !slices.Contains(s.Nonces[k], iface) {
					s.Nonces[k] = append(s.Nonces[k], iface)
					slices.Sort(s.Nonces[k])
				}
			})
		}
	}
	if !r.q.Gateway.IsValid() {
		return
	}
	sha, spa, ok := arpSender(frame)
	if !ok || spa != r.q.Gateway || bytes.Equal(sha, r.bridgeMAC) {
		return
	}
	c := Claim{Iface: iface, MAC: sha.String()}
	r.add(func(s *Sightings) {
		if !slices.Contains(s.GatewayClaims, c) {
			s.GatewayClaims = append(s.GatewayClaims, c)
			slices.SortFunc(s.GatewayClaims, func(a, b Claim) int {
				if a.Iface != b.Iface {
					return cmp.Compare(a.Iface, b.Iface)
				}
				return cmp.Compare(a.MAC, b.MAC)
			})
		}
	})
}

func (r *recorder) add(fn func(*Sightings)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn(&r.out)
}

// sightings returns a copy of what was recorded.
func (r *recorder) sightings() Sightings {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.out
	s.Ports = slices.Clone(s.Ports)
	s.Nonces = make(map[string][]string, len(r.out.Nonces))
	for k, v := range r.out.Nonces {
		s.Nonces[k] = slices.Clone(v)
	}
	s.GatewayClaims = slices.Clone(r.out.GatewayClaims)
	return s
}

// arpSender returns the sender hardware and protocol address of an
// Ethernet/IPv4 ARP frame (with at most one VLAN tag).
func arpSender(f []byte) (net.HardwareAddr, netip.Addr, bool) {
	if len(f) < 14 {
		return nil, netip.Addr{}, false
	}
	off := 12
	if binary.BigEndian.Uint16(f[off:]) == 0x8100 {
		off += 4
	}
	if len(f) < off+2+28 || binary.BigEndian.Uint16(f[off:]) != 0x0806 {
		return nil, netip.Addr{}, false
	}
	a := f[off+2:]
	if binary.BigEndian.Uint16(a[0:]) != 1 || binary.BigEndian.Uint16(a[2:]) != 0x0800 || a[4] != 6 || a[5] != 4 {
		return nil, netip.Addr{}, false
	}
	return net.HardwareAddr(slices.Clone(a[8:14])), netip.AddrFrom4([4]byte(a[14:18])), true
}
