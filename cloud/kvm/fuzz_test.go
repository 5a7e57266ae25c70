package kvm

import (
	"encoding/hex"
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
