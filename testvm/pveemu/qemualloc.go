package pveemu

import (
	"fmt"
	"slices"
	"strings"
)

// A config update may name a new disk as "STORAGE:SIZE[,options]"
// (qemu-server Drive.pm NEW_DISK_RE): update_vm_api checks
// Datastore.AllocateSpace on the storage and that it holds images before
// anything else (API2/Qemu.pm $check_storage_access), and create_disks
// allocates the volume in the worker (vdisk_alloc, find_free_diskname:
// vm-<vmid>-disk-N, the lowest N free). An efidisk0's size is the OVMF
// vars image's, whatever SIZE says (OVMF.pm create_efidisk: 540672 bytes
// for efitype=4m, OVMF_VARS_4M.fd; 131072 for the legacy 2m images), and
// on LVM-thin the volume is an lvcreate -V <size>k (pve-storage
// LvmThinPlugin.pm alloc_image), which LVM rounds up to the volume
// group's extent size (4 MiB by default): the config then reads size=4M.
// The emulator allocates on local-lvm only (its thin volumes are the
// names its configs hold, storagethin.go).

const (
	// efiVars4M and efiVars2M are the sizes of OVMF_VARS_4M.fd and
	// OVMF_VARS.fd (pve-edk2-firmware).
	efiVars4M = 540672
	efiVars2M = 131072
	// lvmExtent is the default extent size of a volume group.
	lvmExtent = 4 << 20
)

// newDiskStorage is the storage of a new-disk value ("" when val is not
// one: an existing volume, a CD-ROM, none).
func newDiskStorage(val string) string {
	m := reNewDisk.FindStringSubmatch(val)
	if m == nil || isCDROM(val) {
		return ""
	}
	return m[1]
}

// allocNewDisksLocked is create_disks for the new disks of changes on VM
// v: each value becomes the allocated volume with its options and size.
func (s *Server) allocNewDisksLocked(v *vm, changes map[string]string) error {
	taken := map[string]bool{}
	for _, tv := range thinVolumesOf(v.conf) {
		taken[tv.name] = true
	}
	for _, k := range sortedKeys(changes) {
		val := changes[k]
		sid := newDiskStorage(val)
		if !reDiskKey.MatchString(k) || sid == "" {
			continue
		}
		if sid != thinStorage {
			return fail("the emulator allocates new disks on %s only, not %s", thinStorage, sid)
		}
		m := reNewDisk.FindStringSubmatch(val)
		size := int64(0)
		if k == "efidisk0" {
			size = efiVarsSize(m[3])
		} else {
			b, err := sizeBytes(m[2], "G")
			if err != nil {
				return paramFail(ParamErrors{k: "invalid size"})
			}
			size = b
		}
		size = (size + lvmExtent - 1) / lvmExtent * lvmExtent
		n := 0
		for taken[fmt.Sprintf("vm-%d-disk-%d", v.vmid, n)] {
			n++
		}
		name := fmt.Sprintf("vm-%d-disk-%d", v.vmid, n)
		taken[name] = true
		changes[k] = fmt.Sprintf("%s:%s%s,size=%s", sid, name, m[3], sizeText(size))
	}
	return nil
}

// efiVarsSize is the size of a new efidisk0 of options opts (",k=v..."):
// the OVMF vars image's of its efitype (OVMF.pm create_efidisk), on
// LVM-thin rounded up to the extent size.
func efiVarsSize(opts string) int64 {
	size := int64(efiVars2M)
	if slices.Contains(strings.Split(opts, ","), "efitype=4m") {
		size = efiVars4M
	}
	return (size + lvmExtent - 1) / lvmExtent * lvmExtent
}

// sizeText is a size as qemu-server's print_drive writes it (format_size:
// the largest unit that divides it).
func sizeText(b int64) string {
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if b%u.n == 0 {
			return fmt.Sprintf("%d%s", b/u.n, u.suffix)
		}
	}
	return fmt.Sprintf("%d", b)
}
