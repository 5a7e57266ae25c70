package pveapi

import (
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestHardwareBootOrderNICFirst: qemu-server's boot order lists NICs
// too (pve-qm-boot "order=net0;scsi0": PXE first). The EFI vars disk of a
// UEFI clone goes on the storage of the first disk of the order (scsi0),
// not on the text before the NIC's first colon ("virtio=BC"), which it
// took when sandbox.BootDisk returned net0 (review 48a).
func TestHardwareBootOrderNICFirst(t *testing.T) {
	cfg := map[string]any{
		"boot":  "order=net0;scsi0",
		"net0":  "virtio=BC:24:11:00:00:01,bridge=vmbr0",
		"scsi0": "local-lvm:base-9000-disk-0/vm-101-disk-0,size=8G",
	}
	body := map[string]any{}
	if err := hardware(body, cfg, sandbox.VMConfig{UEFI: true}); err != nil {
		t.Fatal(err)
	}
	if want := "local-lvm:1,efitype=4m,pre-enrolled-keys=0"; body["efidisk0"] != want {
		t.Errorf("efidisk0 %q, want %q (the boot disk scsi0's storage)", body["efidisk0"], want)
	}
}
