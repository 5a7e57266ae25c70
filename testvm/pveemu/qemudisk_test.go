package pveemu

import (
	"context"
	"net/url"
	"sync"
	"testing"
)

// blockFake is a FakeBackend that records the disks it is asked to
// hot-plug: slot -> by-id name.
type blockFake struct {
	*FakeBackend
	mu   sync.Mutex
	byID map[string]string
}

func (b *blockFake) AttachDisk(_ context.Context, _ int, slot, _, byID string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.byID[slot] = byID
	return nil
}

func (b *blockFake) DetachDisk(_ context.Context, _ int, slot string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.byID, slot)
	return nil
}

// runningClone is a started clone 101 of the template with conf set
// before the start, on a backend that records hot-plugs, and a fresh
// image of it on the dir storage.
func runningClone(t *testing.T, conf url.Values) (*env, *blockFake, string) {
	e := newEnv(t)
	bf := &blockFake{FakeBackend: e.fb, byID: map[string]string{}}
	e.s.backend = bf
	e.setupZone()
	e.clone("101")
	if len(conf) > 0 {
		e.ok("PUT", "/nodes/pve/qemu/101/config", conf)
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/status/start", nil); st != "OK" {
		t.Fatalf("start: %s", st)
	}
	volid, _ := e.ok("POST", "/nodes/pve/storage/local/content", url.Values{"filename": {"vm-101-x.raw"}, "vmid": {"101"}, "size": {"4096"}, "format": {"raw"}}).(string)
	if volid == "" {
		t.Fatal("no volume id")
	}
	return e, bf, volid
}

// TestHotplugDiskName: the by-id name of a hot-plugged scsi disk follows
// the machine version (qemu-server print_drivedevice_full adds
// device_id=drive-scsiN from 10.0); running-qemu is the installed QEMU.
func TestHotplugDiskName(t *testing.T) {
	for _, tt := range []struct{ machine, want, running string }{
		{"", "scsi-0QEMU_QEMU_HARDDISK_drive-scsi1", "pc-i440fx-10.1+pve0"},
		{"q35", "scsi-0QEMU_QEMU_HARDDISK_drive-scsi1", "pc-q35-10.1+pve0"},
		{"pc-q35-10.0+pve1", "scsi-0QEMU_QEMU_HARDDISK_drive-scsi1", "pc-q35-10.0+pve0"},
		{"pc-q35-9.2+pve1", "scsi-0QEMU_QEMU_HARDDISK_abc", "pc-q35-9.2+pve0"},
		{"type=pc-i440fx-8.1,viommu=virtio", "scsi-0QEMU_QEMU_HARDDISK_abc", "pc-i440fx-8.1+pve0"},
	} {
		t.Run(tt.machine, func(t *testing.T) {
			var conf url.Values
			if tt.machine != "" {
				conf = url.Values{"machine": {tt.machine}}
			}
			e, bf, volid := runningClone(t, conf)
			if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"scsi1": {volid + ",serial=abc"}}); st != "OK" {
				t.Fatalf("attach: %s", st)
			}
			if got := bf.byID["scsi1"]; got != tt.want {
				t.Errorf("by-id %q, want %q", got, tt.want)
			}
			st := e.ok("GET", "/nodes/pve/qemu/101/status/current", nil).(map[string]any)
			if st["running-qemu"] != QEMUVersion || st["running-machine"] != tt.running {
				t.Errorf("status: running-qemu %v running-machine %v, want %s %s", st["running-qemu"], st["running-machine"], QEMUVersion, tt.running)
			}
		})
	}
}

// TestHotplugWithoutDiskStaysPending: with hotplug lacking disk the
// update succeeds, nothing is plugged, the disk shows in GET config only
// as a pending value, and deleting it leaves unused0.
func TestHotplugWithoutDiskStaysPending(t *testing.T) {
	e, bf, volid := runningClone(t, url.Values{"hotplug": {"network,usb"}})
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"scsi1": {volid + ",serial=abc"}}); st != "OK" {
		t.Fatalf("attach: %s", st)
	}
	if len(bf.byID) != 0 {
		t.Fatalf("plugged %v without the disk hotplug feature", bf.byID)
	}
	pend := e.ok("GET", "/nodes/pve/qemu/101/config", nil).(map[string]any)
	cur := e.ok("GET", "/nodes/pve/qemu/101/config", url.Values{"current": {"1"}}).(map[string]any)
	if pend["scsi1"] != volid+",serial=abc" || cur["scsi1"] != nil {
		t.Fatalf("scsi1: pending view %v, current view %v; want it pending only", pend["scsi1"], cur["scsi1"])
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"delete": {"scsi1"}, "force": {"1"}}); st != "OK" {
		t.Fatalf("detach: %s", st)
	}
	cur = e.ok("GET", "/nodes/pve/qemu/101/config", url.Values{"current": {"1"}}).(map[string]any)
	if cur["unused0"] != volid || cur["scsi1"] != nil {
		t.Fatalf("after the detach: unused0 %v scsi1 %v, want unused0 %s", cur["unused0"], cur["scsi1"], volid)
	}
}

// TestSnapshotWithTransferDisk: a VM with a raw image of the dir storage
// plugged in cannot be snapshotted (has_feature "snapshot"); once the
// image is unplugged it can.
func TestSnapshotWithTransferDisk(t *testing.T) {
	e, _, volid := runningClone(t, nil)
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"scsi1": {volid + ",serial=abc"}}); st != "OK" {
		t.Fatalf("attach: %s", st)
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/snapshot", url.Values{"snapname": {"s1"}}); st != "snapshot feature is not available" {
		t.Fatalf("snapshot with the transfer disk plugged: %q", st)
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"delete": {"scsi1"}, "force": {"1"}}); st != "OK" {
		t.Fatalf("detach: %s", st)
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/snapshot", url.Values{"snapname": {"s1"}}); st != "OK" {
		t.Fatalf("snapshot after the detach: %q", st)
	}
}
