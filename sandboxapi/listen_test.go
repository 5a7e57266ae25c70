package sandboxapi_test

import (
	"net"
	"os"
	"path/filepath"
	"testing"

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
