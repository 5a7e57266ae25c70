package probe

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
)

const testNonce = "00112233445566778899aabbccddeeff"

func TestValidateLayer2(t *testing.T) {
	l2 := func(kind Kind, mod func(*Target)) *Request {
		tg := Target{ID: "l", Kind: kind, Addr: "10.10.1.1:9", Nonce: testNonce}
		if mod != nil {
			mod(&tg)
		}
		return &Request{Version: Version, Targets: []Target{tg}}
	}
	cases := []struct {
		name string
		req  *Request
		err  string // "" = valid
	}{
		{"control", l2(KindL2Control, nil), ""},
		{"garp", l2(KindL2GratuitousARP, nil), ""},
		{"spoof addr", l2(KindL2SpoofAddr, func(t *Target) { t.SrcAddr = "10.10.1.77" }), ""},
		{"spoof mac", l2(KindL2SpoofMAC, func(t *Target) { t.SrcMAC = "02:00:5e:10:00:01" }), ""},
		{"no nonce", l2(KindL2Control, func(t *Target) { t.Nonce = "" }), "nonce"},
		{"short nonce", l2(KindL2Control, func(t *Target) { t.Nonce = testNonce[2:] }), "nonce"},
		{"upper nonce", l2(KindL2Control, func(t *Target) { t.Nonce = strings.ToUpper(testNonce) }), "nonce"},
		{"v6 gateway", l2(KindL2Control, func(t *Target) { t.Addr = "[fd00::1]:9" }), "IPv4"},
		{"broadcast gateway", l2(KindL2Control, func(t *Target) { t.Addr = "255.255.255.255:9" }), "IPv4"},
		{"control with src_addr", l2(KindL2Control, func(t *Target) { t.SrcAddr = "10.10.1.77" }), "src_addr"},
		{"garp with src_mac", l2(KindL2GratuitousARP, func(t *Target) { t.SrcMAC = "02:00:5e:10:00:01" }), "src_mac"},
		{"spoof addr missing", l2(KindL2SpoofAddr, nil), "src_addr"},
		{"spoof addr is gateway", l2(KindL2SpoofAddr, func(t *Target) { t.SrcAddr = "10.10.1.1" }), "src_addr"},
		{"spoof addr multicast", l2(KindL2SpoofAddr, func(t *Target) { t.SrcAddr = "224.0.0.1" }), "src_addr"},
		{"spoof addr with mac", l2(KindL2SpoofAddr, func(t *Target) { t.SrcAddr, t.SrcMAC = "10.10.1.77", "02:00:5e:10:00:01" }), "src_mac"},
		{"spoof mac missing", l2(KindL2SpoofMAC, nil), "src_mac"},
		{"spoof mac multicast", l2(KindL2SpoofMAC, func(t *Target) { t.SrcMAC = "03:00:5e:10:00:01" }), "src_mac"},
		{"spoof mac zero", l2(KindL2SpoofMAC, func(t *Target) { t.SrcMAC = "00:00:00:00:00:00" }), "src_mac"},
		{"spoof mac upper", l2(KindL2SpoofMAC, func(t *Target) { t.SrcMAC = "02:00:5E:10:00:01" }), "src_mac"},
		{"spoof mac dashes", l2(KindL2SpoofMAC, func(t *Target) { t.SrcMAC = "02-00-5e-10-00-01" }), "src_mac"},
		{"spoof mac long", l2(KindL2SpoofMAC, func(t *Target) { t.SrcMAC = "02:00:5e:10:00:01:02:03" }), "src_mac"},
		{"l2 with path", l2(KindL2Control, func(t *Target) { t.Path = "/" }), "takes only"},
		{"tcp with nonce", &Request{Version: 1, Targets: []Target{{ID: "t", Kind: KindTCP, Addr: "10.0.0.1:22", Nonce: testNonce}}}, "layer-2"},
		{"dns with src_mac", &Request{Version: 1, Targets: []Target{{ID: "d", Kind: KindDNS, Addr: "10.0.0.1:53", Name: "a.b", SrcMAC: "02:00:5e:10:00:01"}}}, "layer-2"},
	}
	for _, c := range cases {
		err := ValidateRequest(c.req)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: unexpected error %v", c.name, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want one mentioning %q", c.name, err, c.err)
		}
	}
}

func TestLayer2Frames(t *testing.T) {
	me := self{iface: "eth0", index: 2, mac: net.HardwareAddr{0xbc, 0x24, 0x11, 0, 1, 1}, addr: netip.MustParseAddr("10.10.1.100")}
	nonce, _ := parseNonce(testNonce)
	spoofMAC := net.HardwareAddr{0x02, 0, 0x5e, 0x10, 0, 1}
	gw := netip.MustParseAddr("10.10.1.1")
	cases := []struct {
		name    string
		t       Target
		frames  int
		srcMAC  net.HardwareAddr
		srcAddr netip.Addr // IPv4 source, or ARP sender address
		err     string
	}{
		{"control", Target{Kind: KindL2Control}, 1, me.mac, me.addr, ""},
		{"spoof addr", Target{Kind: KindL2SpoofAddr, SrcAddr: "10.10.1.77"}, 1, me.mac, netip.MustParseAddr("10.10.1.77"), ""},
		{"spoof mac", Target{Kind: KindL2SpoofMAC, SrcMAC: spoofMAC.String()}, 1, spoofMAC, me.addr, ""},
		{"garp", Target{Kind: KindL2GratuitousARP}, 2, me.mac, gw, ""},
		{"spoof addr is own", Target{Kind: KindL2SpoofAddr, SrcAddr: me.addr.String()}, 0, nil, netip.Addr{}, "own address"},
		{"spoof mac is own", Target{Kind: KindL2SpoofMAC, SrcMAC: me.mac.String()}, 0, nil, netip.Addr{}, "own MAC"},
	}
	for _, c := range cases {
		c.t.Addr, c.t.Nonce = "10.10.1.1:9", testNonce
		frames, desc, err := layer2Frames(c.t, me)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || len(frames) != c.frames || desc == "" {
			t.Fatalf("%s: %d frames, %q, %v", c.name, len(frames), desc, err)
		}
		for i, f := range frames {
			if !bytes.Equal(f[0:6], broadcastMAC) || !bytes.Equal(f[6:12], c.srcMAC) || !bytes.Contains(f, nonce) || len(f) < 60 {
				t.Errorf("%s frame %d: header or nonce wrong: % x", c.name, i, f)
			}
			switch binary.BigEndian.Uint16(f[12:]) {
			case etherTypeIPv4:
				ip := f[14:34]
				if checksum(ip) != 0 || netip.AddrFrom4([4]byte(ip[12:16])) != c.srcAddr || netip.AddrFrom4([4]byte(ip[16:20])) != gw {
					t.Errorf("%s: IPv4 header % x", c.name, ip)
				}
				if !bytes.HasPrefix(f[42:], []byte(FrameMagic)) || int(binary.BigEndian.Uint16(f[16:])) != len(f)-14 {
					t.Errorf("%s: payload or length wrong: % x", c.name, f)
				}
			case etherTypeARP:
				arp := f[14:42]
				if op := binary.BigEndian.Uint16(arp[6:]); op != uint16(i+1) || !bytes.Equal(arp[8:14], me.mac) ||
					netip.AddrFrom4([4]byte(arp[14:18])) != gw || netip.AddrFrom4([4]byte(arp[24:28])) != gw {
					t.Errorf("%s: ARP body % x", c.name, arp)
				}
			default:
				t.Errorf("%s: ether type %#x", c.name, binary.BigEndian.Uint16(f[12:]))
			}
		}
	}
}

func TestLayer2WithoutRoute(t *testing.T) {
	sent := 0
	p := &Prober{SendFrames: func(int, [][]byte) error { sent++; return nil }}
	r := p.one(context.Background(), Target{ID: "l", Kind: KindL2Control, Addr: "10.10.1.1:9", Nonce: testNonce}, "")
	if r.Outcome != OutcomeError || !strings.Contains(r.Detail, "default route") || sent != 0 {
		t.Errorf("no route: %+v, %d sends", r, sent)
	}
	r = p.one(context.Background(), Target{ID: "l", Kind: KindL2Control, Addr: "10.10.1.1:9", Nonce: testNonce}, "nonexistent0")
	if r.Outcome != OutcomeError || sent != 0 {
		t.Errorf("missing interface: %+v, %d sends", r, sent)
	}
}

// FuzzLayer2Request: every layer-2 target the request parser accepts
// builds its frames (no panic), and they carry the nonce.
func FuzzLayer2Request(f *testing.F) {
	f.Add([]byte(`{"version":1,"targets":[{"id":"l1","kind":"l2-control","addr":"10.10.1.1:9","nonce":"00112233445566778899aabbccddeeff"},` +
		`{"id":"l2","kind":"l2-spoof-addr","addr":"10.10.1.1:9","nonce":"00112233445566778899aabbccddeef0","src_addr":"10.10.1.77"},` +
		`{"id":"l3","kind":"l2-spoof-mac","addr":"10.10.1.1:9","nonce":"00112233445566778899aabbccddeef1","src_mac":"02:00:5e:10:00:01"},` +
		`{"id":"l4","kind":"l2-garp","addr":"10.10.1.1:9","nonce":"00112233445566778899aabbccddeef2"}]}`))
	f.Add([]byte(`{"version":1,"targets":[{"id":"l","kind":"l2-spoof-addr","addr":"192.0.2.1:65535","nonce":"ffffffffffffffffffffffffffffffff","src_addr":"10.10.1.100"}]}`))
	me := self{iface: "eth0", index: 2, mac: net.HardwareAddr{0xbc, 0x24, 0x11, 0, 1, 1}, addr: netip.MustParseAddr("10.10.1.100")}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := ParseRequest(bytes.NewReader(data))
		if err != nil {
			return
		}
		for _, tg := range req.Targets {
			if !isLayer2(tg.Kind) {
				continue
			}
			frames, _, err := layer2Frames(tg, me)
			if err != nil {
				if !strings.Contains(err.Error(), "own") {
					t.Fatalf("accepted target %+v builds no frames: %v", tg, err)
				}
				continue
			}
			nonce, _ := parseNonce(tg.Nonce)
			for _, fr := range frames {
				if !bytes.Contains(fr, nonce) || len(fr) < 60 {
					t.Fatalf("frame of %+v: % x", tg, fr)
				}
			}
		}
	})
}
