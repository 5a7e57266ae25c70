package sysbox

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestEnsureShiftedRootfs shifts a fake root: every owner moves up by the
// offset (symbolic links' own owners too), set-id bits stay, the base root
// is left as it was, and a second call reuses the cache.
func TestEnsureShiftedRootfs(t *testing.T) {
	testkit.RequireRoot(t)
	cache := t.TempDir()
	var runs atomic.Int32
	o := RootfsOptions{CacheDir: cache, Mirror: "http://mirror.invalid/debian", debootstrap: fakeDebootstrap(&runs, false)}
	base, err := EnsureRootfs(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	su := filepath.Join(base, "su")
	if err := os.WriteFile(su, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(su, 0, 42); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(su, 0o4755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("su", filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(su, filepath.Join(base, "su-hardlink")); err != nil {
		t.Fatal(err)
	}
	shifted, err := EnsureShiftedRootfs(context.Background(), o, 100000)
	if err != nil {
		t.Fatal(err)
	}
	if shifted != ShiftedRootfsPath(o, 100000) {
		t.Errorf("path %s, want %s", shifted, ShiftedRootfsPath(o, 100000))
	}
	for _, c := range []struct {
		rel       string
		uid, gid  uint32
		mode      uint32
		checkMode bool
	}{
		{rel: ".", uid: 100000, gid: 100000},
		{rel: "etc/os-release", uid: 100000, gid: 100000},
		{rel: "su", uid: 100000, gid: 100042, mode: 0o4755, checkMode: true},
		{rel: "su-hardlink", uid: 100000, gid: 100042, mode: 0o4755, checkMode: true},
		{rel: "link", uid: 100000, gid: 100000},
	} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(shifted, c.rel), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != c.uid || st.Gid != c.gid || c.checkMode && st.Mode&0o7777 != c.mode {
			t.Errorf("%s: %d:%d mode %o, want %d:%d mode %o", c.rel, st.Uid, st.Gid, st.Mode&0o7777, c.uid, c.gid, c.mode)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(su, &st); err != nil || st.Uid != 0 || st.Gid != 42 {
		t.Errorf("the base root changed: %d:%d, %v", st.Uid, st.Gid, err)
	}
	// Cached: a file added to the copy stays, nothing is rebuilt.
	if err := os.WriteFile(filepath.Join(shifted, "marker"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if again, err := EnsureShiftedRootfs(context.Background(), o, 100000); err != nil || again != shifted {
		t.Fatalf("second call: %s, %v", again, err)
	}
	if _, err := os.Stat(filepath.Join(shifted, "marker")); err != nil || runs.Load() != 1 {
		t.Errorf("the shifted root was rebuilt (%v, %d builds)", err, runs.Load())
	}
}

// TestShiftTreeRefuses: ids beyond the mapped range and extended
// attributes that hold ids are refused, not silently left unshifted.
func TestShiftTreeRefuses(t *testing.T) {
	testkit.RequireRoot(t)
	for _, c := range []struct {
		name  string
		setup func(p string) error
		want  string
	}{
		{"owner beyond the range", func(p string) error { return os.Chown(p, 70000, 0) }, "outside the mapped range"},
		{"file capability", func(p string) error {
			// VFS_CAP_REVISION_2, cap_net_raw permitted
			v := []byte{0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
			return unix.Lsetxattr(p, "security.capability", v, 0)
		}, "security.capability"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "f")
			if err := os.WriteFile(p, nil, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := c.setup(p); err != nil {
				t.Fatalf("set up: %v", err)
			}
			if err := ShiftTree(dir, 100000); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an error with %q", err, c.want)
			}
		})
	}
}

// TestShiftTreeACL: a POSIX ACL's named user moves with the offset; its
// other entries (no id) stay.
func TestShiftTreeACL(t *testing.T) {
	testkit.RequireRoot(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "journal")
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	entry := func(tag, perm uint16, id uint32) []byte {
		b := make([]byte, aclEntry)
		binary.LittleEndian.PutUint16(b, tag)
		binary.LittleEndian.PutUint16(b[2:], perm)
		binary.LittleEndian.PutUint32(b[4:], id)
		return b
	}
	acl := []byte{aclVersion, 0, 0, 0}
	for _, e := range [][]byte{entry(0x01, 7, 0xffffffff), entry(aclUser, 5, 42), entry(0x04, 5, 0xffffffff),
		entry(0x10, 5, 0xffffffff), entry(0x20, 5, 0xffffffff)} {
		acl = append(acl, e...)
	}
	if err := unix.Lsetxattr(p, "system.posix_acl_access", acl, 0); err != nil {
		t.Fatalf("set up: %v", err)
	}
	if err := ShiftTree(dir, 100000); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, "system.posix_acl_access", buf)
	if err != nil {
		t.Fatal(err)
	}
	ids := []uint32{}
	for e := buf[4:n]; len(e) > 0; e = e[aclEntry:] {
		ids = append(ids, binary.LittleEndian.Uint32(e[4:]))
	}
	if want := []uint32{0xffffffff, 100042, 0xffffffff, 0xffffffff, 0xffffffff}; fmt.Sprint(ids) != fmt.Sprint(want) {
		t.Errorf("ACL ids %v, want %v", ids, want)
	}
}
