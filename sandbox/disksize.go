package sandbox

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// BootDisk is the key of a VM's boot disk in its configuration (values as
// text): the first entry of boot's order that is a configured disk
// ((ide|sata|scsi|virtio)N) and not a CD-ROM, else the first of scsi0,
// virtio0, sata0, ide0 that is; "" when there is none. The order may list
// NICs too (qemu-server's pve-qm-boot, "order=net0;scsi0" boots PXE
// first): those are skipped. The resize of disk_gib grows this disk
// (pveapi ResizeDisk), and a UEFI clone's EFI vars disk goes on its
// storage (pveapi hardware).
func BootDisk(conf map[string]string) string {
	var order []string
	if o, ok := strings.CutPrefix(conf["boot"], "order="); ok {
		order = strings.Split(o, ";")
	}
	for _, d := range append(order, "scsi0", "virtio0", "sata0", "ide0") {
		if !reDiskSlot.MatchString(d) {
			continue
		}
		if v, ok := conf[d]; ok && !strings.Contains(v, "media=cdrom") {
			return d
		}
	}
	return ""
}

// reDiskSize is a disk's size option, as Proxmox writes it
// (PVE::JSONSchema's disk-size format: a number with an optional unit).
var reDiskSize = regexp.MustCompile(`(?:^|,)size=(\d+(?:\.\d+)?)([KMGT]?)(?:,|$)`)

// diskBytes is the size option of a disk's configuration value, in bytes;
// ok is false when it has none or one not understood.
func diskBytes(val string) (int64, bool) {
	m := reDiskSize.FindStringSubmatch(val)
	if m == nil {
		return 0, false
	}
	f, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, false
	}
	shift := map[string]uint{"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m[2]]
	return int64(f * float64(int64(1)<<shift)), true
}

// checkDiskSizes refuses a VM whose disk_gib is smaller than its
// template's boot disk (an InvalidError naming the field): the resize
// would reach Proxmox and come back refused ("shrinking disks is not
// supported", a 502) after the clone. It reads the configuration of each
// template a VM with disk_gib uses, once; without VMConfigs it cannot know
// and checks nothing.
func (m *Engine) checkDiskSizes(ctx context.Context, names []string, disks []int, ids []int) error {
	if m.o.VMConfigs == nil {
		return nil
	}
	confs := map[int]map[string]string{}
	for i, gib := range disks {
		if gib <= 0 {
			continue
		}
		conf, ok := confs[ids[i]]
		if !ok {
			var err error
			if conf, err = m.o.VMConfigs.VMConfig(ctx, ids[i]); err != nil {
				return pxErr(fmt.Sprintf("read config of template %d", ids[i]), err)
			}
			confs[ids[i]] = conf
		}
		disk := BootDisk(conf)
		size, ok := diskBytes(conf[disk])
		if !ok || int64(gib)<<30 >= size {
			continue
		}
		return invalid(fmt.Sprintf("vms[%d].disk_gib", i),
			"disk_gib %d is smaller than the boot disk %s of template %s (%d bytes): Proxmox does not shrink disks; want 0 (the template's size) or at least %d",
			gib, disk, names[i], size, (size+1<<30-1)>>30)
	}
	return nil
}
