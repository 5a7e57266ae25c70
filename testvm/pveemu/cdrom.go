package pveemu

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// isCDROM reports whether a drive value has media=cdrom.
func isCDROM(val string) bool {
	opts := strings.Split(val, ",")
	return len(opts) > 1 && slices.Contains(opts[1:], "media=cdrom")
}

var reBusSlot = regexp.MustCompile(`^(ide|sata|scsi)(\d+)$`)

// cdromDevice is the guest's device name of the CD-ROM drive in slot: sr
// and its position among the VM's CD-ROM drives, ide before sata before
// scsi, by number - the order a Linux guest finds them in on q35/i440fx
// (a guess: no QEMU in the bed).
func cdromDevice(conf map[string]string, slot string) string {
	bus := map[string]int{"ide": 0, "sata": 1, "scsi": 2}
	type drive struct{ bus, n int }
	key := func(k string) (drive, bool) {
		m := reBusSlot.FindStringSubmatch(k)
		if m == nil {
			return drive{}, false
		}
		n, _ := strconv.Atoi(m[2])
		return drive{bus[m[1]], n}, true
	}
	var all []drive
	for k, val := range conf {
		if d, ok := key(k); ok && isCDROM(val) {
			all = append(all, d)
		}
	}
	sort.Slice(all, func(i, j int) bool {
		return all[i].bus < all[j].bus || all[i].bus == all[j].bus && all[i].n < all[j].n
	})
	me, _ := key(slot)
	for i, d := range all {
		if d == me {
			return "sr" + strconv.Itoa(i)
		}
	}
	return "sr0"
}

// changeMedium is vmconfig_update_disk for an existing CD-ROM drive of a
// running VM: the media type may not change ("unable to change media
// type"); the medium is swapped (Blockdev change_medium) whatever the
// hotplug setting. On a backend that can plug block devices, the ISO of a
// dir-storage volume becomes the guest's srN (cdromDevice); "none" ejects.
func (s *Server) changeMedium(ctx context.Context, v *vm, slot, old, val string) error {
	if isCDROM(old) != isCDROM(val) {
		return paramFail(ParamErrors{slot: "unable to change media type"})
	}
	if !v.running {
		return nil
	}
	bb, ok := s.backendOfLocked(v).(BlockBackend)
	if !ok {
		return nil // the medium is config only
	}
	dev := cdromDevice(v.conf, slot)
	oldFile := strings.SplitN(old, ",", 2)[0]
	newFile := strings.SplitN(val, ",", 2)[0]
	if oldFile == newFile {
		return nil
	}
	if oldFile != "none" && oldFile != "cdrom" {
		_ = bb.DetachDisk(ctx, v.vmid, dev) // nothing to eject is fine
	}
	if newFile == "none" || newFile == "cdrom" {
		return nil
	}
	_, p, isDir, err := s.dirVolumePath("", newFile)
	if err != nil || !isDir {
		return paramFail(ParamErrors{slot: fmt.Sprintf("emulator: cannot insert '%s' (an ISO of the dir storage only)", newFile)})
	}
	n, _ := strconv.Atoi(strings.TrimPrefix(dev, "sr"))
	if err := bb.AttachDisk(ctx, v.vmid, dev, p, fmt.Sprintf("ata-QEMU_DVD-ROM_QM%05d", n)); err != nil {
		return fail("VM %d qmp command 'blockdev-change-medium' failed - %v", v.vmid, err)
	}
	return nil
}
