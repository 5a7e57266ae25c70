package pveapi

import (
	"maps"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestHardware: the configure request's OS type, CPU model and firmware
// keys for a clone's config: the EFI disk on the boot disk's storage, a
// template's 4m EFI disk kept, another refused, nothing for no options, a
// Windows OS type with its machine pinned.
func TestHardware(t *testing.T) {
	clone := map[string]any{"scsi0": "fast-zfs:base-9000-disk-0/vm-101-disk-0,size=8G", "boot": "order=scsi0", "cpu": "x86-64-v2-AES,flags=-nested-virt;+aes"}
	withKey := func(k, v string) map[string]any {
		c := maps.Clone(clone)
		c[k] = v
		return c
	}
	withEFI := func(v string) map[string]any { return withKey("efidisk0", v) }
	for _, tc := range []struct {
		name string
		cfg  map[string]any
		v    sandbox.VMConfig
		want map[string]any
		err  string
	}{
		{"none", clone, sandbox.VMConfig{}, map[string]any{}, ""},
		{"os type and cpu", clone, sandbox.VMConfig{OSType: "win10", CPU: "host"},
			map[string]any{"ostype": "win10", "machine": "pc-q35-10.1", "cpu": "host,flags=+aes;-nested-virt"}, ""},
		{"linux os type leaves the machine", clone, sandbox.VMConfig{OSType: "l26"}, map[string]any{"ostype": "l26"}, ""},
		{"windows keeps a template's newer q35 pin", withKey("machine", "pc-q35-11.0+pve2"), sandbox.VMConfig{OSType: "win11"},
			map[string]any{"ostype": "win11", "machine": "pc-q35-11.0+pve2"}, ""},
		{"windows replaces an older pin", withKey("machine", "pc-q35-9.2+pve1"), sandbox.VMConfig{OSType: "win11"},
			map[string]any{"ostype": "win11", "machine": "pc-q35-10.1"}, ""},
		{"uefi allocates on the boot disk's storage", clone, sandbox.VMConfig{UEFI: true},
			map[string]any{"bios": "ovmf", "efidisk0": "fast-zfs:1,efitype=4m,pre-enrolled-keys=0"}, ""},
		{"a 4m EFI disk of the template is kept", withEFI("fast-zfs:base-9000-disk-1/vm-101-disk-1,efitype=4m,pre-enrolled-keys=1,size=1M"), sandbox.VMConfig{UEFI: true},
			map[string]any{"bios": "ovmf"}, ""},
		{"a 2m EFI disk is refused", withEFI("fast-zfs:vm-101-disk-1,size=128K"), sandbox.VMConfig{UEFI: true}, nil, "not of efitype 4m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := map[string]any{}
			err := hardware(body, tc.cfg, tc.v)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !maps.Equal(body, tc.want) {
				t.Fatalf("body %v, err %v; want %v", body, err, tc.want)
			}
		})
	}
}
