package pveemu

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// thinStorage is the emulated node's LVM-thin storage (storageConfig).
const thinStorage = "local-lvm"

var (
	reThinVolume = regexp.MustCompile(`^(?:vm|base)-(\d+)-\S+$`)
	reUnusedKey  = regexp.MustCompile(`^unused\d+$`)
)

// thinVolume is one logical volume of the thin pool as list_images
// reports it.
type thinVolume struct {
	name  string // the LV's name (vm-<vmid>-disk-N, base-<vmid>-disk-N)
	owner int
}

// listThinContent is GET /nodes/{node}/storage/local-lvm/content: the VM
// images of the node's thin pool (pve-storage LvmThinPlugin list_images:
// every thin LV of the volume group whose name is vm-<vmid>-... or
// base-<vmid>-..., the owner taken from the name, format raw; a linked
// clone's disk is its own LV, vm-<newid>-disk-N, whatever base it was
// cloned from), each only when check_volume_access lets the caller see it
// (API2/Storage/Content.pm index); vmid and content filter (the pool holds
// images only: no containers here). The emulator's volumes are its VMs'
// disks: those the configs of the node's VMs name on local-lvm (disk and
// unusedN keys), and a disk directory whose VM is gone, as
// vm-<vmid>-disk-0 on the primary node (guess: an LV is on the node whose
// volume group holds it, which the emulator does not record for a VM that
// no longer exists).
func (s *Server) listThinContent(rq *request) ([]map[string]any, error) {
	out := []map[string]any{}
	if c := rq.str("content"); c != "" && c != "images" {
		return out, nil
	}
	dirs, err := os.ReadDir(filepath.Join(s.dataDir, "images"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fail("%v", err)
	}
	node := rq.str("node")
	s.mu.Lock()
	if !slices.Contains(strings.Split(s.storageContentLocked(thinStorage, "images,rootdir"), ","), "images") {
		s.mu.Unlock()
		return out, nil
	}
	var vols []thinVolume
	for _, id := range sortedVMIDs(s.vms) {
		if v := s.vms[id]; s.vmNodeLocked(v) == node {
			vols = append(vols, thinVolumesOf(v.conf)...)
		}
	}
	if node == s.node {
		for _, d := range dirs {
			id, err := strconv.Atoi(d.Name())
			if err != nil || s.vms[id] != nil {
				continue
			}
			if _, err := os.Stat(filepath.Join(s.vmDir(id), "disk")); err == nil {
				vols = append(vols, thinVolume{name: "vm-" + d.Name() + "-disk-0", owner: id})
			}
		}
	}
	s.mu.Unlock()
	sort.Slice(vols, func(i, j int) bool { return vols[i].name < vols[j].name })
	for _, v := range vols {
		if rq.has("vmid") && rq.int("vmid", 0) != v.owner || s.checkVolumeAccess(rq.authid, thinStorage, v.owner) != nil {
			continue
		}
		out = append(out, map[string]any{"volid": thinStorage + ":" + v.name, "vmid": v.owner, "format": "raw", "content": "images"})
	}
	return out, nil
}

// thinVolumesOf are the local-lvm volumes a VM's config names (its disks
// and unusedN entries), once each.
func thinVolumesOf(conf map[string]string) []thinVolume {
	seen := map[string]bool{}
	var out []thinVolume
	for k, val := range conf {
		file, _, _ := strings.Cut(val, ",")
		// a cloud-init drive (media=cdrom) is an LV of the pool too
		onThin := volumeStorage(val) == thinStorage || reCloudinitFile.MatchString(file) && strings.HasPrefix(file, thinStorage+":")
		if !reDiskKey.MatchString(k) && !reUnusedKey.MatchString(k) || !onThin {
			continue
		}
		_, name, _ := strings.Cut(file, ":")
		if _, lv, ok := strings.Cut(name, "/"); ok {
			name = lv // base-<base>-disk-N/vm-<vmid>-disk-N: the clone's own LV
		}
		m := reThinVolume.FindStringSubmatch(name)
		if m == nil || seen[name] {
			continue
		}
		owner, _ := strconv.Atoi(m[1])
		seen[name] = true
		out = append(out, thinVolume{name: name, owner: owner})
	}
	return out
}
