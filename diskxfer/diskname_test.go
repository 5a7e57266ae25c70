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
				conf: vmConf("machine=" + tt.machine)}
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

// TestUnpluggableVMRefused: a VM a hot-plugged disk would never reach is
// refused before any image is allocated, naming the fix: one whose
// hotplug lacks disk (Proxmox keeps the disk pending), and one whose SCSI
// controller never tells the guest (lsi, qemu-server's default,
// lsi53c810, megasas: Proxmox plugs it and reports success). The virtio
// SCSI controllers and pvscsi pass.
func TestUnpluggableVMRefused(t *testing.T) {
	const fixHotplug, fixSCSI = "qm set ID --hotplug network,disk,usb", "qm set ID --scsihw virtio-scsi-single"
	for _, tt := range []struct {
		conf string // a vmConf override
		fix  string // "" when the transfer goes ahead
	}{
		{"hotplug=", ""}, {"hotplug=1", ""}, {"hotplug=network,disk,usb", ""}, {"hotplug=disk", ""},
		{"hotplug=0", fixHotplug}, {"hotplug=network,usb", fixHotplug}, {"hotplug=cpu,memory", fixHotplug},
		{"scsihw=", fixSCSI}, {"scsihw=lsi", fixSCSI}, {"scsihw=lsi53c810", fixSCSI}, {"scsihw=megasas", fixSCSI},
		{"scsihw=virtio-scsi-single", ""}, {"scsihw=virtio-scsi-pci", ""}, {"scsihw=pvscsi", ""},
	} {
		t.Run(tt.conf, func(t *testing.T) {
			px := &fakePx{dir: t.TempDir(), conf: vmConf(tt.conf)}
			g := &fakeGuest{res: &apitype.ExecResult{Stdout: []byte(sumOf([]byte("x")) + "\n")}}
			err := New(px, Options{}).Upload(context.Background(), 100, g, "/f", strings.NewReader("x"), 1, 0o644)
			if (tt.fix == "") != (err == nil) {
				t.Fatalf("got %v, want refused %v", err, tt.fix != "")
			}
			if tt.fix != "" && (!errors.Is(err, sandbox.ErrNotConfigured) || !strings.Contains(err.Error(), tt.fix) || len(px.calls) != 0) {
				t.Errorf("got %v with calls %v, want a refusal naming %q before any call", err, px.calls, tt.fix)
			}
		})
	}
}

// TestPendingSlotIsTaken: a slot only pending (a change qemu-server could
// not hot-plug) is not picked again.
func TestPendingSlotIsTaken(t *testing.T) {
	px := &fakePx{dir: t.TempDir(), conf: vmConf("scsi1="), pend: map[string]string{"scsi1": "local-lvm:vm-100-disk-3", "scsi2": "local-lvm:vm-100-disk-4"}}
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
