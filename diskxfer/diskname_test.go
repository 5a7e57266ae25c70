package diskxfer

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"syscall"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestDiskName: the guest looks for the name the VM's machine version
// gives the disk (qemu-server print_drivedevice_full: device_id from 10.0).
func TestDiskName(t *testing.T) {
	tests := []struct {
		name, machine, qemu string
		want                string // "" for the serial's name
		status              bool   // whether the running QEMU was asked
	}{
		{"unpinned q35 on QEMU 10.1", "q35", "10.1.2", "scsi-0QEMU_QEMU_HARDDISK_drive-scsi2", true},
		{"unset on QEMU 10.0", "", "10.0.2", "scsi-0QEMU_QEMU_HARDDISK_drive-scsi2", true},
		{"unpinned on QEMU 9.2", "q35", "9.2.0", "", true},
		{"pinned 9.2 on QEMU 10.1", "pc-q35-9.2+pve1", "10.1.2", "", false},
		{"pinned 10.1 with options", "type=pc-q35-10.1,viommu=intel", "9.2.0", "scsi-0QEMU_QEMU_HARDDISK_drive-scsi2", false},
		{"pinned i440fx 10.0", "pc-i440fx-10.0", "", "scsi-0QEMU_QEMU_HARDDISK_drive-scsi2", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			px := &fakePx{dir: t.TempDir(), qemu: tt.qemu,
				conf: map[string]string{"scsi0": "local-lvm:vm-100-disk-0", "scsi1": "x", "machine": tt.machine}}
			g := &fakeGuest{res: &apitype.ExecResult{Stdout: []byte(sumOf([]byte("x")) + "\n")}}
			if err := New(px, Options{}).Upload(context.Background(), 100, g, "/f", strings.NewReader("x"), 1, 0o644); err != nil {
				t.Fatal(err)
			}
			serial := g.argv[8]
			want := tt.want
			if want == "" {
				want = "scsi-0QEMU_QEMU_HARDDISK_" + serial
			}
			if got := g.argv[4]; got != want {
				t.Errorf("guest looks for %q, want %q", got, want)
			}
			if asked := px.asked > 0; asked != tt.status {
				t.Errorf("asked the running QEMU: %v, want %v (calls %v)", asked, tt.status, px.calls)
			}
		})
	}
}

// TestHotplugWithoutDisk: a VM whose hotplug lacks disk would keep the
// disk pending (the PUT succeeds, nothing appears): refused before any
// image is allocated.
func TestHotplugWithoutDisk(t *testing.T) {
	for _, tt := range []struct {
		hotplug string
		ok      bool
	}{{"", true}, {"1", true}, {"network,disk,usb", true}, {"disk", true}, {"0", false}, {"network,usb", false}, {"cpu,memory", false}} {
		t.Run(tt.hotplug, func(t *testing.T) {
			conf := map[string]string{"scsi0": "x", "machine": "q35"}
			if tt.hotplug != "" {
				conf["hotplug"] = tt.hotplug
			}
			px := &fakePx{dir: t.TempDir(), conf: conf}
			g := &fakeGuest{res: &apitype.ExecResult{Stdout: []byte(sumOf([]byte("x")) + "\n")}}
			err := New(px, Options{}).Upload(context.Background(), 100, g, "/f", strings.NewReader("x"), 1, 0o644)
			if tt.ok != (err == nil) {
				t.Fatalf("got %v, want ok %v", err, tt.ok)
			}
			if !tt.ok && (!errors.Is(err, sandbox.ErrNotConfigured) || !strings.Contains(err.Error(), "hotplug") || len(px.calls) != 0) {
				t.Errorf("got %v with calls %v, want a clear refusal before any call", err, px.calls)
			}
		})
	}
}

// TestPendingSlotIsTaken: a slot only pending (a change qemu-server could
// not hot-plug) is not picked again.
func TestPendingSlotIsTaken(t *testing.T) {
	px := &fakePx{dir: t.TempDir(), conf: map[string]string{"scsi0": "x", "machine": "q35"}, pending: []string{"scsi1", "scsi2"}}
	g := &fakeGuest{res: &apitype.ExecResult{Stdout: []byte(sumOf([]byte("x")) + "\n")}}
	if err := New(px, Options{}).Upload(context.Background(), 100, g, "/f", strings.NewReader("x"), 1, 0o644); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(px.calls, ","), "attach scsi3") {
		t.Errorf("calls %v, want scsi3 attached", px.calls)
	}
}

// TestOpenImageError: an image the unit's sandbox hides or makes
// read-only names the drop-in; other errors do not.
func TestOpenImageError(t *testing.T) {
	for _, tt := range []struct {
		err  error
		hint bool
	}{
		{syscall.EROFS, true},
		{fs.ErrNotExist, true},
		{syscall.EACCES, true},
		{syscall.EIO, false},
	} {
		err := openImageError("/var/lib/x.raw", &fs.PathError{Op: "open", Path: "/var/lib/x.raw", Err: tt.err})
		if !errors.Is(err, tt.err) || strings.Contains(err.Error(), "transfer-storage.conf") != tt.hint {
			t.Errorf("%v: %v (want hint %v)", tt.err, err, tt.hint)
		}
	}
}
