package diskxfer

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// The name a hot-plugged disk gets in the guest depends on the VM's
// machine version. qemu-server (QemuServer/DriveDevice.pm
// print_drivedevice_full) gives every SCSI hard disk device_id=drive-<slot>
// from machine version 10.0, and QEMU puts device_id, not the serial, in
// the page udev names /dev/disk/by-id from; before 10.0 device_id defaults
// to the serial. The machine version is the one the config pins, else
// the QEMU version the node runs (get_vm_machine, extract_version).

// reMachine is qemu-server Machine.pm extract_version_parts.
var reMachine = regexp.MustCompile(`^(?:pc(?:-i440fx|-q35)?|virt)-(\d+)\.(\d+)`)

// reQEMU is a QEMU version ("10.1.2").
var reQEMU = regexp.MustCompile(`^(\d+)\.(\d+)`)

// machineMajor returns the major machine version pinned by a machine
// option ("pc-q35-9.2+pve1", "type=pc-q35-10.1,viommu=intel"), and false
// when the option pins none ("", "q35", "pc").
func machineMajor(machine string) (int, bool) {
	typ := ""
	for _, part := range strings.Split(machine, ",") {
		if t, ok := strings.CutPrefix(part, "type="); ok {
			typ = t
			break
		}
		if !strings.Contains(part, "=") {
			typ = part
			break
		}
	}
	m := reMachine.FindStringSubmatch(typ)
	if m == nil {
		return 0, false
	}
	n, _ := strconv.Atoi(m[1])
	return n, true
}

// diskName returns the by-id name of the disk slot with serial in VM
// vmid, whose config's machine option is machine.
func (t *Transfer) diskName(ctx context.Context, vmid int, machine, slot, serial string) (string, error) {
	major, ok := machineMajor(machine)
	if !ok {
		q, err := t.px.RunningQEMU(ctx, vmid)
		if err != nil {
			return "", fmt.Errorf("disk transfer: machine version: %w", err)
		}
		m := reQEMU.FindStringSubmatch(q)
		if m == nil {
			return "", fmt.Errorf("disk transfer: machine version: QEMU version %q", q)
		}
		major, _ = strconv.Atoi(m[1])
	}
	return byIDName(major, slot, serial), nil
}

// byIDName is the /dev/disk/by-id name of a scsi-hd in slot with serial
// on machine version major.
func byIDName(major int, slot, serial string) string {
	if major >= 10 {
		return "scsi-0QEMU_QEMU_HARDDISK_drive-" + slot
	}
	return "scsi-0QEMU_QEMU_HARDDISK_" + serial
}

// hotplugsDisks says whether a VM with this hotplug option hot-plugs
// disks (qemu-server parse_hotplug_features: unset or "1" is the default
// network,disk,usb, "0" nothing).
func hotplugsDisks(hotplug string) bool {
	if hotplug == "" || hotplug == "1" {
		return true
	}
	return slices.Contains(strings.Split(strings.ReplaceAll(hotplug, " ", ""), ","), "disk")
}

// openImageError explains a transfer image the daemon cannot open: under
// the shipped unit (ProtectSystem=strict, PrivateDevices=yes,
// DevicePolicy=closed) only the dir storage local's images directory is
// open to it; other storages need the unit's drop-in.
func openImageError(path string, err error) error {
	if errors.Is(err, syscall.EROFS) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("disk transfer: open image %s: %w (under pve-inspectd.service, a transfer storage other than local needs the drop-in /usr/share/doc/pve-inspectd/examples/transfer-storage.conf)", path, err)
	}
	return fmt.Errorf("disk transfer: open image %s: %w", path, err)
}
