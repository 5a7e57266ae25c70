package sandboxapi_test

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
)

func TestListenUnix(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "api.sock")
	ln, err := sandboxapi.ListenUnix(sock, "", 0o660)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o660 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %v %v", fi.Mode(), err)
	}
	if _, err := sandboxapi.ListenUnix(sock, "", 0o660); err == nil {
		t.Fatal("second listener on a served socket succeeded")
	}
	accepted := make(chan struct{})
	go func(l net.Listener) {
		defer close(accepted)
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}(ln)
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	<-accepted
	ln.Close()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left after close: %v", err)
	}
	// a stale socket (no server) is replaced; a regular file is refused
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	ln, err = sandboxapi.ListenUnix(sock, "", 0o600)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	ln.Close()
	if err := os.WriteFile(sock, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := sandboxapi.ListenUnix(sock, "", 0o600); err == nil {
		t.Error("regular file replaced")
	}
	if entries, _ := os.ReadDir(filepath.Dir(sock)); len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
}

// TestListenUnixGroup: with a socket group, a socket directory others
// cannot traverse (the unit's 0750) is given to the group with traverse
// only; the socket gets the group and the mode; a directory others can
// traverse is left alone.
func TestListenUnixGroup(t *testing.T) {
	testkit.RequireRoot(t) // gives files to another group
	const gid = 65534
	for _, tc := range []struct {
		name          string
		dirMode, want os.FileMode
		wantGID       int
	}{
		{"runtime dir 0750", 0o750, 0o710, gid},
		{"world-traversable dir", 0o755, 0o755, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "run")
			if err := os.Mkdir(dir, tc.dirMode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, tc.dirMode); err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(dir, "api.sock")
			ln, err := sandboxapi.ListenUnix(sock, "65534", 0o660)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			for _, c := range []struct {
				path string
				mode os.FileMode
				gid  int
			}{{dir, tc.want, tc.wantGID}, {sock, 0o660, gid}} {
				fi, err := os.Stat(c.path)
				if err != nil {
					t.Fatal(err)
				}
				st := fi.Sys().(*syscall.Stat_t)
				if fi.Mode().Perm() != c.mode || int(st.Gid) != c.gid {
					t.Errorf("%s: mode %v gid %d, want %v gid %d", c.path, fi.Mode().Perm(), st.Gid, c.mode, c.gid)
				}
			}
		})
	}
}
