package pveemu

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// QEMUVersion is the QEMU the emulated node has installed (pve-qemu-kvm
// of Proxmox VE 9.1): the version qemu-server's kvm_user_version reports,
// which an unpinned machine type takes (FIDELITY.md, "Disk names").
const QEMUVersion = "10.1.2"

// reMachineVersion is qemu-server Machine.pm extract_version_parts: the
// major and minor version of a versioned machine type.
var reMachineVersion = regexp.MustCompile(`^(?:pc(?:-i440fx|-q35)?|virt)-(\d+)\.(\d+)(?:\.\d+)?(?:\+pve\d+)?(?:\.pxe)?`)

// machineVersion is the machine version a hot-plug of v's disks uses
// (qemu-server vmconfig_hotplug_pending: get_vm_machine of the config,
// then extract_version with kvm_user_version): the version pinned by the
// config's machine type, else the installed QEMU's.
func machineVersion(conf map[string]string) (major, minor int) {
	typ := conf["machine"]
	for _, part := range strings.Split(typ, ",") {
		if t, ok := strings.CutPrefix(part, "type="); ok {
			typ = t
			break
		}
		if !strings.Contains(part, "=") {
			typ = part
			break
		}
	}
	if m := reMachineVersion.FindStringSubmatch(typ); m != nil {
		major, _ = strconv.Atoi(m[1])
		minor, _ = strconv.Atoi(m[2])
		return major, minor
	}
	f := strings.SplitN(QEMUVersion, ".", 3)
	major, _ = strconv.Atoi(f[0])
	minor, _ = strconv.Atoi(f[1])
	return major, minor
}

// diskByID is the /dev/disk/by-id name a Linux guest's udev gives the
// disk qemu-server hot-plugs into slot with config value val
// (print_drivedevice_full): a scsi-hd's name comes from its VPD device
// identification page, which QEMU fills with the device_id property,
// defaulting to the serial. From machine version 10.0 qemu-server sets
// device_id=drive-<slot>, so the name no longer carries the serial.
// virtio-blk has no device_id: its name is virtio-<serial>.
func diskByID(slot, val string, major int) (string, error) {
	serial := ""
	if m := reSerial.FindStringSubmatch(val); m != nil {
		serial = m[1]
	}
	switch {
	case strings.HasPrefix(slot, "scsi"):
		id := serial
		if major >= 10 {
			id = "drive-" + slot
		}
		if id == "" {
			id = "drive-" + slot // QEMU's fallback: the drive's name
		}
		return "scsi-0QEMU_QEMU_HARDDISK_" + id, nil
	case strings.HasPrefix(slot, "virtio"):
		if serial == "" {
			serial = "pveemu" + slot // udev makes no by-id link; the bed needs one
		}
		return "virtio-" + serial, nil
	}
	return "", fmt.Errorf("emulator: cannot hot-plug %s (scsiN and virtioN only)", slot)
}

// runningMachine is status/current's running-machine of a VM started with
// conf (qemu-server current_from_query_machines: the machine type with
// its +pve version; an unpinned type runs as the installed QEMU's).
func runningMachine(conf map[string]string) string {
	major, minor := machineVersion(conf)
	base := "pc-i440fx"
	if strings.Contains(conf["machine"], "q35") {
		base = "pc-q35"
	}
	return fmt.Sprintf("%s-%d.%d+pve0", base, major, minor)
}

// hotplugDisk says whether a VM with conf hot-plugs disks (qemu-server
// parse_hotplug_features: unset or "1" is the default
// "network,disk,usb", "0" nothing, else the listed features).
func hotplugDisk(conf map[string]string) bool {
	h, ok := conf["hotplug"]
	if !ok || h == "1" {
		return true
	}
	return slices.Contains(splitList(h), "disk")
}

// dropPendingLocked writes an update's changes and deletions over v's
// pending section the way update_vm does before it hot-plugs anything
// (qemu-server API2/Qemu.pm $update_vm_api): deleting a key whose value is
// only pending drops that value, a disk's volume registered as unusedN
// (vmconfig_register_unused_drive), and leaves no deletion behind when
// the key is not in the config (cleanup_pending); setting a key replaces
// its pending value (a disk's old one registered the same way) and
// cancels its pending deletion (remove_from_pending_delete); a key set to
// its current value is no change (cleanup_pending). It returns the
// changes and deletions left to apply.
func dropPendingLocked(v *vm, changes map[string]string, deletes []string) (map[string]string, []string) {
	var del []string
	for _, d := range deletes {
		if pv, ok := v.pending[d]; ok {
			delete(v.pending, d)
			if reDiskKey.MatchString(d) {
				registerUnused(v, pv)
			}
		}
		if _, ok := v.conf[d]; ok {
			del = append(del, d)
		}
	}
	out := make(map[string]string, len(changes))
	for k, val := range changes {
		if pv, ok := v.pending[k]; ok {
			delete(v.pending, k)
			if pv != val && reDiskKey.MatchString(k) {
				registerUnused(v, pv)
			}
		}
		delete(v.pendingDel, k)
		if cur, ok := v.conf[k]; ok && cur == val {
			continue
		}
		out[k] = val
	}
	return out, del
}

// registerUnused is vmconfig_register_unused_drive for a disk value of v:
// a volume the VM owns (vm_is_volid_owner) becomes its first free unusedN,
// never twice (pve-guest-common AbstractConfig add_unused_volume);
// CD-ROMs and other VMs' volumes are not registered.
func registerUnused(v *vm, val string) {
	if isCDROM(val) {
		return
	}
	volid := strings.SplitN(val, ",", 2)[0]
	if volumeOwner(volid) != v.vmid {
		return
	}
	for k, x := range v.conf {
		if strings.HasPrefix(k, "unused") && x == volid {
			return
		}
	}
	v.conf[freeUnused(v.conf)] = volid
}

// reOwnedName is a VM image's name (pve-storage parse_volname's owner:
// vm-<vmid>-... or base-<vmid>-...).
var reOwnedName = regexp.MustCompile(`^(?:vm|base)-(\d+)-`)

// volumeOwner is the VM a volume id's image name says owns it (0: none).
func volumeOwner(volid string) int {
	_, name, ok := strings.Cut(volid, ":")
	if !ok {
		return 0
	}
	name = name[strings.LastIndex(name, "/")+1:]
	m := reOwnedName.FindStringSubmatch(name)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// deferDisks keeps the disk changes and deletions of a running VM whose
// hotplug lacks disk in its pending section and returns the rest of the
// update. qemu-server's update_vm writes every change to [PENDING] and
// vmconfig_hotplug_pending applies what it can: for a disk without the
// disk feature vmconfig_update_disk dies "skip", so the PUT succeeds and
// the disk stays pending until the next start.
func deferDisks(v *vm, changes map[string]string, deletes []string, force bool) (map[string]string, []string) {
	if !v.running || hotplugDisk(v.conf) {
		return changes, deletes
	}
	now := map[string]string{}
	for k, val := range changes {
		if !reDiskKey.MatchString(k) || isCDROM(v.conf[k]) && isCDROM(val) {
			// a CD-ROM's medium changes whatever the hotplug setting
			now[k] = val
			continue
		}
		if v.pending == nil {
			v.pending = map[string]string{}
		}
		v.pending[k] = val
	}
	var del []string
	for _, d := range deletes {
		if !reDiskKey.MatchString(d) {
			del = append(del, d)
			continue
		}
		pendDelete(v, d, force)
	}
	return now, del
}

// pendDelete records a deletion of key k that waits in v's pending
// section (AbstractConfig add_to_pending_delete; force: "!k").
func pendDelete(v *vm, k string, force bool) {
	if v.pendingDel == nil {
		v.pendingDel = map[string]bool{}
	}
	v.pendingDel[k] = force
}

// scsiHotplugSeen says whether the guest learns of a SCSI disk hot-plugged
// on controller scsihw ("" is qemu-server's default, lsi). qemu-server
// plugs it on every controller alike (vm_deviceplug: device_add through
// the human monitor, whose error it does not read, and no
// qemu_deviceaddverify for scsiN), and QEMU's SCSI bus accepts it
// (hw/scsi/scsi-bus.c: every bus is its own hotplug handler), but only
// virtio-scsi (virtio_scsi_hotplug: a VIRTIO_SCSI_T_TRANSPORT_RESET
// rescan event) and pvscsi (pvscsi_hotplug: PVSCSI_MSG_DEV_ADDED) tell
// the guest; lsi53c895a, lsi53c810 and megasas have no hotplug handler,
// so the guest sees the disk only after a rescan of its own.
func scsiHotplugSeen(scsihw string) bool {
	switch scsihw {
	case "virtio-scsi-pci", "virtio-scsi-single", "pvscsi":
		return true
	}
	return false
}

// withPending is v's config with its pending values, as GET .../config
// returns it unless current=1 (pve-guest-common AbstractConfig
// load_current_config).
func withPending(v *vm) map[string]string {
	if len(v.pending) == 0 && len(v.pendingDel) == 0 {
		return v.conf
	}
	out := copyConf(v.conf)
	for k, val := range v.pending {
		out[k] = val
	}
	for k := range v.pendingDel {
		delete(out, k)
	}
	return out
}

// snapshotCapable says whether every disk of conf can be snapshotted
// (pve-guest-common AbstractConfig __snapshot_prepare: has_feature
// "snapshot" over every non-CD-ROM volume; pve-storage's dir plugin
// snapshots qcow2 images only). A raw image on the dir storage, such as a
// transfer disk plugged in, makes the snapshot fail.
func snapshotCapable(conf map[string]string) bool {
	for k, val := range conf {
		if !reDiskKey.MatchString(k) || volumeStorage(val) != dirStorage {
			continue
		}
		if file, _, _ := strings.Cut(val, ","); !strings.HasSuffix(file, ".qcow2") {
			return false
		}
	}
	return true
}

// applyPendingLocked applies v's pending values and deletions the way
// qemu-server's vm_start_nolock does before it starts a VM
// (vmconfig_apply_pending): each pending deletion of a disk detaches it
// (vmconfig_delete_or_detach_drive: with force its volume of the dir
// storage is freed, else it becomes unusedN), then each pending value is
// set, a disk it replaces registered as unusedN
// (vmconfig_register_unused_drive). A deletion that fails stays pending,
// as qemu-server keeps it with a warning. s.mu is held.
func applyPendingLocked(s *Server, v *vm) {
	dels := make([]string, 0, len(v.pendingDel))
	for k := range v.pendingDel {
		dels = append(dels, k)
	}
	slices.Sort(dels)
	for _, k := range dels {
		val, ok := v.conf[k]
		if ok && reDiskKey.MatchString(k) {
			volid := strings.SplitN(val, ",", 2)[0]
			if v.pendingDel[k] {
				if _, p, _, err := s.volumePath("", volid); err == nil {
					if err := removeImage(p); err != nil {
						continue // stays pending
					}
				}
			} else {
				v.conf[freeUnused(v.conf)] = volid
			}
		}
		delete(v.conf, k)
		delete(v.pendingDel, k)
	}
	for k, val := range v.pending {
		if old, ok := v.conf[k]; ok && reDiskKey.MatchString(k) {
			v.conf[freeUnused(v.conf)] = strings.SplitN(old, ",", 2)[0]
		}
		v.conf[k] = val
		delete(v.pending, k)
	}
}

// coldDisks are the disks of conf a start plugs from the dir storage
// (qemu-server config_to_command: every drive of the config is part of
// the VM from its start): slot -> image path, with the by-id name the
// guest sees.
func (s *Server) coldDisks(conf map[string]string) []coldDisk {
	var out []coldDisk
	major, _ := machineVersion(conf)
	for k, val := range conf {
		if !reDiskKey.MatchString(k) || (!strings.HasPrefix(k, "scsi") && !strings.HasPrefix(k, "virtio")) {
			continue
		}
		_, p, _, err := s.volumePath("", strings.SplitN(val, ",", 2)[0])
		if err != nil {
			continue // not the dir storage's: the guest's own disk directory stands for it
		}
		byID, err := diskByID(k, val, major)
		if err != nil {
			continue
		}
		out = append(out, coldDisk{slot: k, image: p, byID: byID})
	}
	slices.SortFunc(out, func(a, b coldDisk) int { return strings.Compare(a.slot, b.slot) })
	return out
}

// coldDisk is one disk a VM start attaches (coldDisks).
type coldDisk struct{ slot, image, byID string }

// pendingArray is GET .../pending (qemu-server vm_pending,
// pve-guest-common GuestHelpers config_with_pending_array): one item per
// key of the config with its value, its pending value and delete (1, or
// 2 for a forced deletion) when it has them; then the keys only pending;
// then the pending deletions of keys not in the config.
func pendingArray(v *vm) []map[string]any {
	var out []map[string]any
	keys := make([]string, 0, len(v.conf))
	for k := range v.conf {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	delFlag := func(force bool) int {
		if force {
			return 2
		}
		return 1
	}
	for _, k := range keys {
		item := map[string]any{"key": k, "value": v.conf[k]}
		if pv, ok := v.pending[k]; ok {
			item["pending"] = pv
		}
		if force, ok := v.pendingDel[k]; ok {
			item["delete"] = delFlag(force)
		}
		out = append(out, item)
	}
	var rest []string
	for k := range v.pending {
		if _, ok := v.conf[k]; !ok {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	for _, k := range rest {
		out = append(out, map[string]any{"key": k, "pending": v.pending[k]})
	}
	rest = rest[:0]
	for k := range v.pendingDel {
		if _, ok := v.conf[k]; !ok {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	for _, k := range rest {
		out = append(out, map[string]any{"key": k, "delete": delFlag(v.pendingDel[k])})
	}
	return out
}

// freeOwnedImagesLocked frees the dir storage's images of v that its
// config names, current or pending, unusedN included (qemu-server
// destroy_vm: $remove_owned_drive over the config and its pending
// section; a volume of another VM is left). A failed removal is a
// warning of task t, as destroy_vm logs it. s.mu is held.
func (s *Server) freeOwnedImagesLocked(t *task, v *vm) {
	vals := make([]string, 0, len(v.conf)+len(v.pending))
	for _, m := range []map[string]string{v.conf, v.pending} {
		for k, val := range m {
			// drive_is_cdrom($drive, 1): a cloud-init drive is no CD-ROM here
			if (reDiskKey.MatchString(k) || strings.HasPrefix(k, "unused")) && (!isCDROM(val) || reCloudinitFile.MatchString(parseDrive(val).file)) {
				vals = append(vals, strings.SplitN(val, ",", 2)[0])
			}
		}
	}
	slices.Sort(vals)
	for _, volid := range slices.Compact(vals) {
		_, p, _, owner, err := s.imagePath("", volid)
		if err != nil || owner != v.vmid {
			continue
		}
		if err := removeImage(p); err != nil {
			t.warn("Could not remove disk '%s', check manually: %v", volid, err)
		}
	}
}
