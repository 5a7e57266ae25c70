package probe

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"
)

// NonceLen is the length in bytes of a layer-2 target's nonce.
const NonceLen = 16

// FrameMagic starts the UDP payload of every layer-2 probe datagram; the
// nonce follows it. ARP frames carry the nonce in their padding.
const FrameMagic = "pve-inspect-l2:"

// Layer-2 frame constants.
const (
	etherTypeIPv4 = 0x0800
	etherTypeARP  = 0x0806
	l2Repeats     = 3                     // each frame is sent this often
	l2Gap         = 20 * time.Millisecond // between repeats
)

var broadcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// isLayer2 reports the layer-2 target kinds.
func isLayer2(k Kind) bool {
	switch k {
	case KindL2Control, KindL2SpoofAddr, KindL2SpoofMAC, KindL2GratuitousARP:
		return true
	}
	return false
}

// validateLayer2 checks a layer-2 target; gw is Addr's address.
func validateLayer2(t Target, gw netip.Addr) error {
	if t.Method != "" || t.Path != "" || len(t.Headers) != 0 || t.Name != "" || t.QType != "" || t.Host != "" || t.Resolver != "" {
		return fmt.Errorf("%s target takes only id, kind, addr, nonce, src_addr, src_mac, timeout_ms", t.Kind)
	}
	if !gw.Is4() || !gw.IsGlobalUnicast() {
		return fmt.Errorf("addr: %s is not a unicast IPv4 gateway", gw)
	}
	if _, err := parseNonce(t.Nonce); err != nil {
		return err
	}
	switch t.Kind {
	case KindL2SpoofAddr:
		a, err := netip.ParseAddr(t.SrcAddr)
		if err != nil || !a.Is4() || !a.IsGlobalUnicast() || a == gw {
			return fmt.Errorf("src_addr %q: want a unicast IPv4 address other than the gateway", clip(t.SrcAddr, 64))
		}
		if t.SrcMAC != "" {
			return errors.New("src_mac belongs to l2-spoof-mac")
		}
	case KindL2SpoofMAC:
		if _, err := parseUnicastMAC(t.SrcMAC); err != nil {
			return err
		}
		if t.SrcAddr != "" {
			return errors.New("src_addr belongs to l2-spoof-addr")
		}
	default:
		if t.SrcAddr != "" || t.SrcMAC != "" {
			return fmt.Errorf("%s target takes no src_addr or src_mac", t.Kind)
		}
	}
	return nil
}

// parseNonce accepts exactly NonceLen bytes in lowercase hex.
func parseNonce(s string) ([]byte, error) {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != NonceLen || s != strings.ToLower(s) {
		return nil, fmt.Errorf("nonce %q: want %d lowercase hex digits", clip(s, 64), 2*NonceLen)
	}
	return b, nil
}

// parseUnicastMAC accepts a unicast, non-zero Ethernet address in its
// canonical form (lowercase, colons).
func parseUnicastMAC(s string) (net.HardwareAddr, error) {
	m, err := net.ParseMAC(s)
	if err != nil || len(m) != 6 || m.String() != s || m[0]&1 != 0 || string(m) == string(make([]byte, 6)) {
		return nil, fmt.Errorf("src_mac %q: want a unicast Ethernet address like 02:00:00:00:00:01", clip(s, 64))
	}
	return m, nil
}

// self is the guest's own identity on the interface it sends on.
type self struct {
	iface string
	index int
	mac   net.HardwareAddr
	addr  netip.Addr
}

// layer2 sends a layer-2 target's frames on iface (the interface of the
// IPv4 default route).
func (p *Prober) layer2(ctx context.Context, t Target, iface string) Result {
	if iface == "" {
		return Result{Outcome: OutcomeError, Detail: "no IPv4 default route: no interface to send on"}
	}
	gw := netip.MustParseAddrPort(t.Addr)
	me, err := lookupSelf(iface, gw.Addr())
	if err != nil {
		return Result{Outcome: OutcomeError, Detail: err.Error()}
	}
	frames, desc, err := layer2Frames(t, me)
	if err != nil {
		return Result{Outcome: OutcomeError, Detail: err.Error()}
	}
	send := p.SendFrames
	if send == nil {
		send = sendRaw
	}
	for i := range l2Repeats {
		if i > 0 {
			select {
			case <-ctx.Done():
				return Result{Outcome: OutcomeError, Detail: "interrupted: " + ctx.Err().Error()}
			case <-time.After(l2Gap):
			}
		}
		if err := send(me.index, frames); err != nil {
			return Result{Outcome: OutcomeError, Detail: "send on " + iface + ": " + err.Error()}
		}
	}
	return Result{Outcome: OutcomeSent, Detail: fmt.Sprintf("%s on %s, %d times", desc, iface, l2Repeats)}
}

// lookupSelf finds iface's MAC and its IPv4 address in gw's subnet (else
// its first IPv4 address).
func lookupSelf(iface string, gw netip.Addr) (self, error) {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return self{}, fmt.Errorf("interface %s: %w", iface, err)
	}
	if len(ifc.HardwareAddr) != 6 {
		return self{}, fmt.Errorf("interface %s has no Ethernet address", iface)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return self{}, fmt.Errorf("addresses of %s: %w", iface, err)
	}
	me := self{iface: iface, index: ifc.Index, mac: ifc.HardwareAddr}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		pfx, err := netip.ParsePrefix(ipn.String())
		if err != nil || !pfx.Addr().Is4() {
			continue
		}
		if !me.addr.IsValid() || pfx.Contains(gw) {
			me.addr = pfx.Addr()
		}
		if pfx.Contains(gw) {
			break
		}
	}
	if !me.addr.IsValid() {
		return self{}, fmt.Errorf("interface %s has no IPv4 address", iface)
	}
	return me, nil
}

// layer2Frames builds a validated layer-2 target's frames as me would
// send them, and says what they claim.
func layer2Frames(t Target, me self) ([][]byte, string, error) {
	nonce, err := parseNonce(t.Nonce)
	if err != nil {
		return nil, "", err
	}
	gw, err := netip.ParseAddrPort(t.Addr)
	if err != nil {
		return nil, "", fmt.Errorf("addr: %w", err)
	}
	payload := append([]byte(FrameMagic), nonce...)
	switch t.Kind {
	case KindL2Control:
		return [][]byte{udpFrame(me.mac, me.addr, gw, payload)},
			fmt.Sprintf("UDP from %s %s to %s", me.mac, me.addr, gw), nil
	case KindL2SpoofAddr:
		src := netip.MustParseAddr(t.SrcAddr)
		if src == me.addr {
			return nil, "", fmt.Errorf("src_addr %s is the guest's own address", src)
		}
		return [][]byte{udpFrame(me.mac, src, gw, payload)},
			fmt.Sprintf("UDP from %s %s (own %s) to %s", me.mac, src, me.addr, gw), nil
	case KindL2SpoofMAC:
		mac, err := parseUnicastMAC(t.SrcMAC)
		if err != nil {
			return nil, "", err
		}
		if string(mac) == string(me.mac) {
			return nil, "", fmt.Errorf("src_mac %s is the guest's own MAC", mac)
		}
		return [][]byte{udpFrame(mac, me.addr, gw, payload)},
			fmt.Sprintf("UDP from %s (own %s) %s to %s", mac, me.mac, me.addr, gw), nil
	case KindL2GratuitousARP:
		return [][]byte{arpFrame(1, me.mac, gw.Addr(), nonce), arpFrame(2, me.mac, gw.Addr(), nonce)},
			fmt.Sprintf("ARP request and reply: %s is at %s", gw.Addr(), me.mac), nil
	}
	return nil, "", fmt.Errorf("kind %q is not a layer-2 kind", clip(string(t.Kind), 16))
}

// ethernet returns a broadcast Ethernet header from src.
func ethernet(src net.HardwareAddr, etherType uint16) []byte {
	h := make([]byte, 14, 64)
	copy(h[0:6], broadcastMAC)
	copy(h[6:12], src)
	binary.BigEndian.PutUint16(h[12:], etherType)
	return h
}

// udpFrame is a broadcast IPv4/UDP datagram from (mac, src) to dst
// (source port = destination port), without a UDP checksum (allowed over
// IPv4).
func udpFrame(mac net.HardwareAddr, src netip.Addr, dst netip.AddrPort, payload []byte) []byte {
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, 17 // version 4, IHL 5; TTL; UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	s, d := src.As4(), dst.Addr().As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	binary.BigEndian.PutUint16(ip[10:], checksum(ip))
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], dst.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	f := append(ethernet(mac, etherTypeIPv4), ip...)
	f = append(f, udp...)
	return append(f, payload...)
}

// arpFrame is a broadcast gratuitous ARP (op 1 request, 2 reply): sender
// and target address addr, sender hardware address mac; the nonce rides
// in the padding to the minimum frame size.
func arpFrame(op uint16, mac net.HardwareAddr, addr netip.Addr, nonce []byte) []byte {
	a := addr.As4()
	body := make([]byte, 28)
	binary.BigEndian.PutUint16(body[0:], 1) // Ethernet
	binary.BigEndian.PutUint16(body[2:], etherTypeIPv4)
	body[4], body[5] = 6, 4
	binary.BigEndian.PutUint16(body[6:], op)
	copy(body[8:14], mac)
	copy(body[14:18], a[:])
	if op == 2 {
		copy(body[18:24], broadcastMAC)
	}
	copy(body[24:28], a[:])
	f := append(ethernet(mac, etherTypeARP), body...)
	f = append(f, nonce...)
	for len(f) < 60 {
		f = append(f, 0)
	}
	return f
}

// checksum is the Internet checksum (RFC 1071).
func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}
