package kvm

import (
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"
)

// FuzzExpectedSHA512: SHA512SUMS comes from the network; whatever it holds,
// a returned digest is 128 lowercase hex digits.
func FuzzExpectedSHA512(f *testing.F) {
	f.Add([]byte(strings.Repeat("a", 128)+"  debian-13-genericcloud-amd64.qcow2\n"), "debian-13-genericcloud-amd64.qcow2")
	f.Add([]byte(strings.Repeat("A", 128)+" *x.qcow2\n"), "x.qcow2")
	f.Add([]byte("zz  x\n"), "x")
	f.Fuzz(func(t *testing.T, sums []byte, name string) {
		d, err := ExpectedSHA512(sums, name)
		if err != nil {
			return
		}
		if b, err := hex.DecodeString(d); err != nil || len(b) != 64 || strings.ToLower(d) != d {
			t.Fatalf("bad digest %q", d)
		}
	})
}

// FuzzParseNodeMeta: domain metadata can be written by any client of the
// same libvirtd; whatever it holds, a parsed tag has valid fields.
func FuzzParseNodeMeta(f *testing.F) {
	f.Add(`<node><instance-id>pve1-0123456789ab</instance-id><network>pve-nested</network><address>192.168.150.2</address><mac>52:54:00:12:34:56</mac><created>2026-12-01T12:00:00Z</created></node>`)
	f.Add(`<node xmlns="urn:x"><instance-id>x</instance-id></node>`)
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseNodeMeta(s)
		if err != nil {
			return
		}
		if !validInstanceID(m.InstanceID) || !validNetName(m.Network) || !validMAC(m.MAC) || !netip.MustParseAddr(m.Address).Is4() {
			t.Fatalf("accepted %+v", m)
		}
	})
}
