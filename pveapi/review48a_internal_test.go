package pveapi

import (
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestReviewHardwareBootOrderNICFirst (review 48a): qemu-server's boot
// order lists NICs too (pve-qm-boot "order=net0;scsi0": PXE first), and
// sandbox.BootDisk returns the first entry the config has that is not a
// CD-ROM, so for such a template it returns net0. hardware() then takes
// the text before the NIC's first colon ("virtio=BC") as the storage of
// the EFI vars disk and sends efidisk0 "virtio=BC:1,..." instead of one on
// the boot disk's storage (ResizeDisk resizes "net0" the same way).
func TestReviewHardwareBootOrderNICFirst(t *testing.T) {
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
