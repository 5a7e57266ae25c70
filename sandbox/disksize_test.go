package sandbox

import "testing"

// TestBootDiskAndSize: the boot disk as pveapi's resize picks it, and its
// size option in bytes in each unit Proxmox writes.
func TestBootDiskAndSize(t *testing.T) {
	tests := []struct {
		name  string
		conf  map[string]string
		disk  string
		bytes int64
		ok    bool
	}{
		{"scsi0", map[string]string{"scsi0": "local-lvm:base-9000-disk-0,size=8G"}, "scsi0", 8 << 30, true},
		{"boot order", map[string]string{"boot": "order=ide2;virtio1;scsi0", "ide2": "none,media=cdrom", "virtio1": "local:vm-1-disk-1,size=2252M", "scsi0": "x,size=1G"}, "virtio1", 2252 << 20, true},
		{"nic first in order", map[string]string{"boot": "order=net0;scsi0", "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0", "scsi0": "s:d,size=8G"}, "scsi0", 8 << 30, true},
		{"cdrom only in order", map[string]string{"boot": "order=ide2", "ide2": "none,media=cdrom", "sata0": "s:d,size=1T"}, "sata0", 1 << 40, true},
		{"bytes", map[string]string{"scsi0": "s:d,size=34359738368,ssd=1"}, "scsi0", 34359738368, true},
		{"kib", map[string]string{"scsi0": "s:d,ssd=1,size=1024K"}, "scsi0", 1 << 20, true},
		{"fraction", map[string]string{"scsi0": "s:d,size=1.5G"}, "scsi0", 3 << 29, true},
		{"no size", map[string]string{"scsi0": "s:d"}, "scsi0", 0, false},
		{"not a size option", map[string]string{"scsi0": "s:d,iosize=4G"}, "scsi0", 0, false},
		{"no disk", map[string]string{"ide2": "none,media=cdrom"}, "", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := BootDisk(tc.conf)
			if d != tc.disk {
				t.Fatalf("BootDisk = %q, want %q", d, tc.disk)
			}
			n, ok := diskBytes(tc.conf[d])
			if n != tc.bytes || ok != tc.ok {
				t.Errorf("diskBytes(%q) = %d %v, want %d %v", tc.conf[d], n, ok, tc.bytes, tc.ok)
			}
		})
	}
}
