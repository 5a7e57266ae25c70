package pveemu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// BlockBackend is a Backend that can hot-plug a raw image into a running
// guest as a block device, the way QEMU's device_add of a scsi-hd or
// virtio-blk with serial= does (FIDELITY.md, issue 18).
type BlockBackend interface {
	// AttachDisk makes image the guest's disk in slot (e.g. "scsi1"),
	// linked as /dev/disk/by-id/<byID> (diskByID).
	AttachDisk(ctx context.Context, vmid int, slot, image, byID string) error
	// DetachDisk unplugs the disk in slot.
	DetachDisk(ctx context.Context, vmid int, slot string) error
}

// The emulated node has one directory storage that holds raw VM images:
// "local" (the name of a fresh node's dir storage), under DataDir/storage.
const dirStorage = "local"

var (
	reImageName = regexp.MustCompile(`^vm-(\d+)-[^/\s]+\.(raw|qcow2|vmdk)$`)
	reVolName   = regexp.MustCompile(`^(\d+)/(vm-(\d+)-[^/\s]+\.raw)$`)
	reSerial    = regexp.MustCompile(`(?:^|,)serial=([^,]*)`)
)

func (s *Server) storageDir() string { return filepath.Join(s.dataDir, "storage", dirStorage) }

// reportedPath is p (under storageDir) as the client sees it
// (Options.StoragePath).
func (s *Server) reportedPath(p string) string {
	if s.storagePath == "" {
		return p
	}
	rel, err := filepath.Rel(s.storageDir(), p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return p
	}
	return filepath.Join(s.storagePath, rel)
}

// splitVolume splits a volume id (with or without "<storage>:") into the
// dir storage and the volume name (Content.pm $real_volume_id).
func splitVolume(storage, volume string) (string, string, error) {
	name := volume
	if sid, rest, ok := strings.Cut(volume, ":"); ok {
		if storage != "" && sid != storage {
			return "", "", paramFail(ParamErrors{"volume": fmt.Sprintf("storage ID mismatch (%s != %s)", sid, storage)})
		}
		storage, name = sid, rest
	}
	if storage != dirStorage {
		return "", "", fail("storage '%s' does not exist", storage)
	}
	return storage, name, nil
}

// volumePath maps a volume id (with or without "local:") to its file.
func (s *Server) volumePath(storage, volume string) (volid, path string, owner int, err error) {
	storage, name, err := splitVolume(storage, volume)
	if err != nil {
		return "", "", 0, err
	}
	m := reVolName.FindStringSubmatch(name)
	if m == nil || m[1] != m[3] {
		return "", "", 0, fail("unable to parse directory volume name '%s'", name)
	}
	owner, _ = strconv.Atoi(m[1])
	return storage + ":" + name, filepath.Join(s.storageDir(), "images", m[1], m[2]), owner, nil
}

// imagePath is volumePath for an image of any format the dir storage
// holds (raw, qcow2, vmdk: an imported disk, a cloud-init drive), with
// its format.
func (s *Server) imagePath(storage, volume string) (volid, path, format string, owner int, err error) {
	storage, name, err := splitVolume(storage, volume)
	if err != nil {
		return "", "", "", 0, err
	}
	m := reImagesVol.FindStringSubmatch(name)
	if m == nil || m[1] != m[3] {
		return "", "", "", 0, fail("unable to parse directory volume name '%s'", name)
	}
	owner, _ = strconv.Atoi(m[1])
	return storage + ":" + name, filepath.Join(s.storageDir(), "images", m[1], m[2]), m[4], owner, nil
}

// allocVolume is POST /nodes/{node}/storage/{storage}/content: vdisk_alloc
// of a raw image on the dir storage.
func (s *Server) allocVolume(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	storage, name, vmid := rq.str("storage"), rq.str("filename"), rq.int("vmid", 0)
	size, ok := parseKiB(rq.str("size"))
	if !ok {
		return nil, paramFail(ParamErrors{"size": fmt.Sprintf("unable to parse size '%s'", rq.str("size"))})
	}
	if storage != dirStorage {
		return nil, fail("storage '%s' does not exist", storage)
	}
	m := reImageName.FindStringSubmatch(name)
	if m == nil {
		return nil, fail("unable to parse volume filename '%s'", name)
	}
	if f := rq.str("format"); f != "" && f != m[2] {
		return nil, paramFail(ParamErrors{"format": fmt.Sprintf("different storage formats (%s != %s)", f, m[2])})
	}
	if m[2] != "raw" {
		return nil, fail("emulator: only raw images are supported")
	}
	if m[1] != strconv.Itoa(vmid) {
		return nil, fail("illegal name '%s' - should be 'vm-%d-*'", name, vmid)
	}
	dir := filepath.Join(s.storageDir(), "images", strconv.Itoa(vmid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fail("%v", err)
	}
	p := filepath.Join(dir, name)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if errors.Is(err, fs.ErrExist) {
		return nil, fail("disk image '%s' already exists", p)
	}
	if err != nil {
		return nil, fail("%v", err)
	}
	err = f.Truncate(size * 1024)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(p)
		return nil, fail("%v", err)
	}
	return dirStorage + ":" + strconv.Itoa(vmid) + "/" + name, nil
}

// parseKiB parses the size parameter: KiB, or with an M or G suffix.
func parseKiB(v string) (int64, bool) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(v, "M"):
		mult, v = 1024, strings.TrimSuffix(v, "M")
	case strings.HasSuffix(v, "G"):
		mult, v = 1024*1024, strings.TrimSuffix(v, "G")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > 1<<40/mult {
		return 0, false
	}
	return n * mult, true
}

// checkVolumeAccess is PVE::Storage::check_volume_access for images:
// Datastore.Allocate on the storage, or Datastore.Audit on it and
// VM.Config.Disk on the owner.
func (s *Server) checkVolumeAccess(authid, storage string, owner int) error {
	if authid == "root@pam" || s.privileges(authid, "/storage/"+storage)["Datastore.Allocate"] {
		return nil
	}
	if err := s.checkPrivs(authid, "/storage/"+storage, []string{"Datastore.Audit"}, false); err != nil {
		return err
	}
	return s.checkPrivs(authid, "/vms/"+strconv.Itoa(owner), []string{"VM.Config.Disk"}, false)
}

// volumeInfo is GET /nodes/{node}/storage/{storage}/content/{volume}.
func (s *Server) volumeInfo(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	volid, p, format, owner, err := s.imagePath(rq.str("storage"), rq.str("volume"))
	if err != nil {
		imgErr := err
		var ok bool
		if volid, p, ok, err = s.dirVolumePath(rq.str("storage"), rq.str("volume")); err != nil {
			return nil, err
		}
		if !ok {
			return nil, imgErr
		}
		if format, err = s.checkDirVolumeAccess(rq.authid, volid); err != nil {
			return nil, err
		}
	} else if err := s.checkVolumeAccess(rq.authid, dirStorage, owner); err != nil {
		return nil, err
	}
	st, err := os.Stat(p)
	if err != nil {
		return nil, fail("volume_size_info on '%s' failed - no format", volid)
	}
	if st.Size() == 0 {
		return nil, fail("volume '%s' has size zero", volid)
	}
	size := st.Size()
	if info, err := probeImage(p, format); err == nil {
		size = info.size
	}
	return map[string]any{"path": s.reportedPath(p), "size": size, "used": st.Size(), "format": format}, nil
}

// checkDirVolumeAccess is check_volume_access (no VM) for a volume of
// the dir storage that is not an image: Datastore.Allocate on the
// storage, or for an iso, vztmpl or import volume Datastore.AllocateSpace
// or Datastore.Audit; it returns the format volume_size_info reads it
// with (parse_volname's: an import volume's extension, raw for the rest
// and for an OVA, which file_size_info falls back to).
func (s *Server) checkDirVolumeAccess(authid, volid string) (string, error) {
	_, name, _ := strings.Cut(volid, ":")
	v, _ := parseDirVolname(name)
	format := "raw"
	if v.vtype == "import" {
		if f := dirContentFormat("import", v.file); f == "qcow2" || f == "vmdk" {
			format = f
		}
	}
	if authid == "root@pam" || s.privileges(authid, "/storage/"+dirStorage)["Datastore.Allocate"] {
		return format, nil
	}
	switch v.vtype {
	case "iso", "vztmpl", "import":
		return format, s.checkPrivs(authid, "/storage/"+dirStorage, []string{"Datastore.AllocateSpace", "Datastore.Audit"}, true)
	}
	return "", fail("missing privileges to access %s", volid)
}

// freeVolume is DELETE /nodes/{node}/storage/{storage}/content/{volume}:
// Datastore.Allocate on the storage, then vdisk_free in an imgdel task.
func (s *Server) freeVolume(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	volid, p, isDir, err := s.dirVolumePath(rq.str("storage"), rq.str("volume"))
	if err != nil {
		return nil, err
	}
	owner := 0
	if !isDir {
		if volid, p, _, owner, err = s.imagePath(rq.str("storage"), rq.str("volume")); err != nil {
			return nil, err
		}
	}
	// The task's id is "[<owner vmid>@]<storage>" (Content.pm delete), never
	// the volume id: a UPID's fields hold no ':' (PVE::Tools upid_decode).
	taskID := dirStorage
	if owner > 0 {
		taskID = strconv.Itoa(owner) + "@" + dirStorage
	}
	if rq.authid != "root@pam" {
		if err := s.checkPrivs(rq.authid, "/storage/"+dirStorage, []string{"Datastore.Allocate"}, false); err != nil {
			return nil, err
		}
	}
	return s.startTask(rq, "imgdel", taskID, func(_ context.Context, t *task) error {
		if isDir {
			// vdisk_free of a file that is not an image: unlink
			if err := os.Remove(p); err != nil {
				return err
			}
		} else if err := removeImage(p); err != nil {
			return err
		}
		t.logf("Removed volume '%s'", volid)
		return nil
	}), nil
}

func removeImage(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	_ = os.Remove(filepath.Dir(p)) // the per-VM directory, when empty
	return nil
}

// hotplugDisks applies the disk part of a config update to v (s.mu held),
// like vmconfig_hotplug_pending on a running VM: a new disk key whose
// volume is on the dir storage is attached through the backend; a deleted
// disk key is unplugged and becomes unusedN, or with force is freed; a
// deleted unusedN is freed (try_deallocate_drive). Only volumes of the dir
// storage are handled; other disk keys stay plain config. A new disk that
// fails to plug stays pending, a deletion that fails to unplug stays a
// pending deletion (vmconfig_hotplug_pending keeps every key whose eval
// died): those keys come back with their "hotplug problem - ..." message,
// for the caller to leave alone and raise after the rest is applied.
// Other errors come back before anything changed (the checks of the new
// disks) or as they happen.
func (s *Server) hotplugDisks(ctx context.Context, u *configUpdate, v *vm, changes map[string]string, deletes []string) (ParamErrors, error) {
	plugs, err := s.newDisksLocked(v, changes)
	if err != nil {
		return nil, err
	}
	failed := ParamErrors{}
	for _, d := range deletes {
		val, ok := v.conf[d]
		if !ok {
			continue
		}
		volid := strings.SplitN(val, ",", 2)[0]
		_, p, owner, err := s.volumePath("", volid)
		if err != nil {
			continue // not ours (e.g. local-lvm): plain config
		}
		switch {
		case strings.HasPrefix(d, "unused"):
			if err := s.deallocateLocked(u.authid, owner, v.vmid, p); err != nil {
				return nil, err
			}
		case reDiskKey.MatchString(d):
			if v.running {
				if err := s.unplugLocked(ctx, v, d); err != nil {
					pendDelete(v, d, u.force)
					failed[d] = "hotplug problem - " + err.Error()
					continue
				}
			}
			if !u.force {
				registerUnused(v, val)
			} else if err := s.deallocateLocked(u.authid, owner, v.vmid, p); err != nil {
				// vmconfig_delete_or_detach_drive runs inside the
				// hot-plug's eval: the deletion stays pending
				pendDelete(v, d, u.force)
				failed[d] = "hotplug problem - " + err.Error()
			}
		}
	}
	for _, k := range sortedKeys(changes) {
		val := changes[k]
		if !reDiskKey.MatchString(k) {
			continue
		}
		if old, ok := v.conf[k]; ok && (isCDROM(old) || isCDROM(val)) {
			if err := s.changeMedium(ctx, v, k, old, val); err != nil {
				return nil, err
			}
			continue
		}
		p, ok := plugs[k]
		if !ok || !v.running {
			continue
		}
		if err := s.plugLocked(ctx, v, k, val, p); err != nil {
			if v.pending == nil {
				v.pending = map[string]string{}
			}
			v.pending[k] = val
			failed[k] = "hotplug problem - " + err.Error()
		}
	}
	return failed, nil
}

// newDisksLocked checks the new disks of changes that are images of the
// dir storage and returns their paths by key: the VM's own volume, an
// existing image, a free slot.
func (s *Server) newDisksLocked(v *vm, changes map[string]string) (map[string]string, error) {
	out := map[string]string{}
	for _, k := range sortedKeys(changes) {
		val := changes[k]
		if !reDiskKey.MatchString(k) {
			continue
		}
		if old, ok := v.conf[k]; ok && (isCDROM(old) || isCDROM(val)) {
			continue
		}
		volid := strings.SplitN(val, ",", 2)[0]
		_, p, owner, err := s.volumePath("", volid)
		if err != nil {
			continue
		}
		if owner != v.vmid {
			return nil, paramFail(ParamErrors{k: fmt.Sprintf("volume '%s' belongs to VM %d", volid, owner)})
		}
		if _, err := os.Stat(p); err != nil {
			return nil, paramFail(ParamErrors{k: fmt.Sprintf("volume '%s' does not exist", volid)})
		}
		if _, used := v.conf[k]; used {
			return nil, paramFail(ParamErrors{k: "hotplug problem - slot in use"})
		}
		out[k] = p
	}
	return out, nil
}

// deallocateLocked is try_deallocate_drive for an image of the dir
// storage at p: the VM's own volume is freed, with Datastore.AllocateSpace
// on the storage; another VM's is only dropped from the config.
func (s *Server) deallocateLocked(authid string, owner, vmid int, p string) error {
	if owner != vmid {
		return nil
	}
	if authid != "root@pam" {
		if err := s.checkPrivsLocked(authid, "/storage/"+dirStorage, []string{"Datastore.AllocateSpace"}); err != nil {
			return err
		}
	}
	if err := removeImage(p); err != nil {
		return fail("%v", err)
	}
	return nil
}

// plugLocked hot-plugs the image p into the running VM v as slot with
// config value val (vm_deviceplug): an injected failure (FailNextHotplug)
// fails it; a SCSI disk on a controller that tells the guest nothing
// (scsiHotplugSeen) is plugged in QEMU only.
func (s *Server) plugLocked(ctx context.Context, v *vm, slot, val, p string) error {
	if reason, ok := s.hotplugFailures[v.vmid]; ok {
		delete(s.hotplugFailures, v.vmid)
		return errors.New(reason)
	}
	bb, ok := s.backendOfLocked(v).(BlockBackend)
	if !ok {
		return errors.New("the emulator's backend cannot hot-plug disks")
	}
	if strings.HasPrefix(slot, "scsi") && !scsiHotplugSeen(v.conf["scsihw"]) {
		if v.unseen == nil {
			v.unseen = map[string]bool{}
		}
		v.unseen[slot] = true
		return nil
	}
	major, _ := machineVersion(v.conf)
	byID, err := diskByID(slot, val, major)
	if err != nil {
		return err
	}
	return bb.AttachDisk(ctx, v.vmid, slot, p, byID)
}

// unplugLocked unplugs disk slot from the running VM v (vm_deviceunplug).
func (s *Server) unplugLocked(ctx context.Context, v *vm, slot string) error {
	if v.unseen[slot] {
		delete(v.unseen, slot)
		return nil
	}
	bb, ok := s.backendOfLocked(v).(BlockBackend)
	if !ok {
		return errors.New("the emulator's backend cannot unplug disks")
	}
	return bb.DetachDisk(ctx, v.vmid, slot)
}

// FailNextHotplug makes the next disk hot-plug into VM vmid fail with
// reason, as qemu-server's vm_deviceplug dies when QEMU refuses the device
// or its controller (e.g. "error on hotplug device 'virtioscsi1'" from
// qemu_deviceaddverify): the disk stays pending and the config update
// fails with "hotplug problem - <reason>".
func (s *Server) FailNextHotplug(vmid int, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hotplugFailures == nil {
		s.hotplugFailures = map[int]string{}
	}
	s.hotplugFailures[vmid] = reason
}

// freeUnused is the first unusedN key not in conf.
func freeUnused(conf map[string]string) string {
	for i := 0; ; i++ {
		k := "unused" + strconv.Itoa(i)
		if _, ok := conf[k]; !ok {
			return k
		}
	}
}
