package kvm

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/cavaliergopher/cpio"
)

// TestInitramfsFormat reads the boot test's hand-written newc archive back
// with an independent cpio reader, so the TCG test's initramfs is known to be
// well formed even where no kernel is at hand to boot it.
func TestInitramfsFormat(t *testing.T) {
	dir := t.TempDir()
	initBin := filepath.Join(dir, "init")
	if err := os.WriteFile(initBin, []byte("\x7fELF stand-in"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "initrd")
	writeInitramfs(t, path, initBin, map[string][]byte{"virtio.ko": []byte("abc"), "virtio_blk.ko": []byte("defgh")}, []string{"virtio.ko", "virtio_blk.ko"})
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := cpio.NewReader(bytes.NewReader(b))
	got := map[string]string{}
	modes := map[string]cpio.FileMode{}
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = string(data)
		modes[h.Name] = h.Mode
	}
	want := map[string]string{
		"dev": "", "proc": "", "sys": "", "modules": "", "dev/console": "",
		"init": "\x7fELF stand-in", "modules/virtio.ko": "abc", "modules/virtio_blk.ko": "defgh",
		"modules/order": "virtio.ko\nvirtio_blk.ko\n",
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %q (present %v), want %q", k, g, ok, v)
		}
	}
	if modes["dev/console"]&cpio.TypeChar != cpio.TypeChar || modes["init"].Perm() != 0o755 || modes["dev"]&cpio.TypeDir != cpio.TypeDir {
		t.Errorf("modes: console %o init %o dev %o", modes["dev/console"], modes["init"], modes["dev"])
	}
}
