package egress

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
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
		Domain: func(z string) string { return z + ".test" }, Now: func() time.Time { return time.Unix(1600000000, 0) }}
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

// TestLeaseNamesInstance: a host name does not outlive its lease, the
// lease file it came from or its zone (issue 34): an expired lease names
// nothing (its address may be another guest's), a file replaced by
// another of the same size and time is read again, and Forget drops what
// was read of a zone.
func TestLeaseNamesInstance(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "za.leases")
	now := time.Unix(1800000000, 0)
	write := func(host string, exp int64) {
		t.Helper()
		tmp := path + ".new"
		line := fmt.Sprintf("%d 02:00:00:00:00:01 10.10.1.100 %s *\n", exp, host)
		if err := os.WriteFile(tmp, []byte(line), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(tmp, now, now); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	l := &LeaseNames{LeaseFile: func(z string) string { return filepath.Join(dir, z+".leases") }, Now: func() time.Time { return now }}
	write("old-a", now.Unix()+60)
	if !l.Holds("za", "old-a") {
		t.Fatal("a live lease is not held")
	}
	// the address's lease expired: its old name goes with it
	now = now.Add(2 * time.Minute)
	if l.Holds("za", "old-a") {
		t.Error("an expired lease still names its host")
	}
	now = now.Add(-2 * time.Minute)
	// another file of the same size and time (the zone made anew, a
	// new tenant's guest took the address): read again
	write("new-b", now.Unix()+60)
	if l.Holds("za", "old-a") || !l.Holds("za", "new-b") {
		t.Errorf("a replaced lease file of the same size and time: old-a %v, new-b %v", l.Holds("za", "old-a"), l.Holds("za", "new-b"))
	}
	// an infinite lease (expiry 0) holds
	write("inf-c", 0)
	if !l.Holds("za", "inf-c") {
		t.Error("an infinite lease is not held")
	}
	l.Forget("za")
	l.mu.Lock()
	_, kept := l.cache["za"]
	l.mu.Unlock()
	if kept {
		t.Error("Forget kept the zone's names")
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
