package testvm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func TestAttachBlock(t *testing.T) {
	testkit.RequireRoot(t)
	b, ga, _ := upTwoZones(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	img := filepath.Join(t.TempDir(), "img.raw")
	data := bytes.Repeat([]byte("pve-inspect block "), 1<<16) // 1.1 MiB
	data = data[:1<<20]
	if err := os.WriteFile(img, data, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	link := "/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_pvei0test"

	for _, tt := range []struct{ name, byID string }{{"../x", "ok"}, {"sdb", "a/b"}, {"", "ok"}} {
		if err := b.AttachBlock(ctx, ga.VMID, img, tt.name, tt.byID); err == nil {
			t.Errorf("AttachBlock(%q, %q) accepted", tt.name, tt.byID)
		}
	}
	if err := b.AttachBlock(ctx, ga.VMID, img, "sdb", "scsi-0QEMU_QEMU_HARDDISK_pvei0test"); err != nil {
		t.Fatal(err)
	}
	if err := b.AttachBlock(ctx, ga.VMID, img, "sdb", "other"); err == nil {
		t.Error("a second device of the same name was attached")
	}
	// The guest's own root reads it through the by-id link (as the guest's
	// agent would), the other guest has no such device.
	out := rawExec(t, ga.Socket, "/bin/sh", "-c", "sha256sum < "+link)
	if !strings.HasPrefix(out, hex.EncodeToString(sum[:])) {
		t.Fatalf("guest read %q, want sha256 %x", out, sum)
	}
	// The guest writes, the host sees it in the image.
	rawExec(t, ga.Socket, "/bin/sh", "-c", "printf written | dd of="+link+" conv=notrunc,fsync status=none")
	got, err := os.ReadFile(img)
	if err != nil || !bytes.HasPrefix(got, []byte("written")) {
		t.Fatalf("image after the guest's write starts %q (%v)", got[:16], err)
	}
	if err := b.DetachBlock(ctx, ga.VMID, "sdb"); err != nil {
		t.Fatal(err)
	}
	if out := rawExec(t, ga.Socket, "/bin/sh", "-c", "ls /dev/sdb "+link+" 2>&1; echo end"); !strings.Contains(out, "No such file") || strings.Contains(out, "\n/dev/sdb\n") {
		t.Errorf("device still in the guest: %q", out)
	}
	if out, _ := exec.Command("losetup", "-j", img).Output(); len(out) != 0 {
		t.Errorf("loop device left: %s", out)
	}
	if err := b.DetachBlock(ctx, ga.VMID, "sdb"); err == nil {
		t.Error("a second detach succeeded")
	}
	// StopGuest frees a device still attached.
	if err := b.AttachBlock(ctx, ga.VMID, img, "sdc", "x"); err != nil {
		t.Fatal(err)
	}
	if err := b.StopGuest(ctx, ga.VMID); err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command("losetup", "-j", img).Output(); len(out) != 0 {
		t.Errorf("loop device left after StopGuest: %s", out)
	}
	// Closing the bed frees a device whose guest was never stopped and
	// whose image (inside the bed's directory) is gone.
	bimg := filepath.Join(b.Dir(), "img2.raw")
	if err := os.WriteFile(bimg, data, 0o600); err != nil {
		t.Fatal(err)
	}
	gb, _ := b.Guest(102)
	if err := b.AttachBlock(ctx, gb.VMID, bimg, "sdd", "y"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(bimg); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command("losetup", "-a").Output(); bytes.Contains(out, []byte(b.Dir())) {
		t.Errorf("loop device left after Close: %s", out)
	}
}
