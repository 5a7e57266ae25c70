package egress

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLeaseNames(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "za.leases")
	leases := "1700000000 02:00:00:00:00:01 10.10.1.100 vm101 01:02:00:00:00:00:01\n" +
		"0 02:00:00:00:00:02 10.10.1.101 * *\n" +
		"1700000000 02:00:00:00:00:03 10.10.1.102 Evil.Name.org *\n" +
		"duid 00:01:00:01\n" +
		"1700000000 02:00:00:00:00:04 10.10.1.103 VM104 *\n"
	if err := os.WriteFile(path, []byte(leases), 0o600); err != nil {
		t.Fatal(err)
	}
	l := &LeaseNames{LeaseFile: func(z string) string { return filepath.Join(dir, z+".leases") },
		Domain: func(z string) string { return z + ".test" }}
	for _, tc := range []struct {
		zone, name string
		want       bool
	}{
		{"za", "vm101", true},
		{"za", "vm104", true},
		{"za", "vm101.za.test", true},
		{"za", "gateway.za.test", true}, // under the domain
		{"za", "vm102", false},
		{"za", "evil.name.org", false},
		{"za", "vm101.zb.test", false},
		{"zb", "vm101", false}, // another zone's lease
		{"za", "", false},
	} {
		if got := l.Holds(tc.zone, tc.name); got != tc.want {
			t.Errorf("Holds(%s, %q) = %v, want %v", tc.zone, tc.name, got, tc.want)
		}
	}
	// the file is read again when it changes
	if err := os.WriteFile(path, []byte(leases+"1700000000 02:00:00:00:00:05 10.10.1.105 vm105 *\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !l.Holds("za", "vm105") {
		t.Error("a new lease was not seen")
	}
}

func FuzzLeaseHosts(f *testing.F) {
	f.Add("1700000000 02:00:00:00:00:01 10.10.1.100 vm101 *\n")
	f.Add("duid x\n0 a b * *\n")
	f.Fuzz(func(t *testing.T, s string) {
		got := leaseHosts(strings.NewReader(s))
		for _, h := range slices.Collect(maps.Keys(got)) {
			if checkName(h) != nil || strings.Contains(h, ".") || h != strings.ToLower(h) {
				t.Fatalf("bad host name %q", h)
			}
		}
	})
}
