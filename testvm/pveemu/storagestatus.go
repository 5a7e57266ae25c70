package pveemu

import (
	"context"
	"fmt"
	"syscall"
)

// StorageSpace is the size of a storage as its status reports it, bytes,
// as pve-common's df reports a file system's (Tools.pm df: Filesys::Df's
// blocks, used and bavail): Total its blocks, Used the blocks in use
// (blocks - bfree), Avail what an unprivileged user may still use
// (bavail). Used is more than Total - Avail by the blocks a file system
// reserves (ext4's 5 % for root).
type StorageSpace struct {
	Total, Used, Avail int64
	// Inactive makes the storage one Proxmox could not activate (an NFS
	// server gone, a mount missing): storage_info's entry stays as it
	// starts, active 0 and every size 0.
	Inactive bool
}

// SetStorageSpace makes storage id report space from now on, whatever
// its file system holds (a test's full storage, or an inactive one; df by
// default). A Used of 0 with a Total is taken as Total - Avail (a file
// system without reserved blocks).
func (s *Server) SetStorageSpace(id string, space StorageSpace) {
	if space.Used == 0 {
		space.Used = space.Total - space.Avail
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.storageSpace[id] = space
}

// storageStatus is GET /nodes/{node}/storage/{storage}/status (pve-storage
// API2/Storage/Status.pm read_status, Datastore.Audit or
// Datastore.AllocateSpace on /storage/{storage} from the schema): the
// storage's entry of storage_info (Storage.pm): type, content, shared,
// enabled, active and its sizes; an unknown storage is the parameter
// exception "No such storage.". A dir storage's sizes are df of its path
// (Plugin.pm status, pve-common Tools.pm df: Filesys::Df's blocks, used
// and bavail, used being blocks - bfree, not total - avail); the
// emulator's local-lvm, whose volumes are files in the data directory,
// reports that file system's too (a guess: LvmThinPlugin.pm status
// reports the thin pool's lv_size and used). SetStorageSpace overrides
// both, and may make a storage inactive (storage_info: an entry whose
// activate_storage failed keeps active 0 and sizes 0).
func (s *Server) storageStatus(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	id := rq.str("storage")
	s.mu.Lock()
	c := s.storageConfig(id)
	space, set := s.storageSpace[id]
	known := s.storages[id]
	s.mu.Unlock()
	if c == nil || !known {
		return nil, paramFail(ParamErrors{"storage": "No such storage."})
	}
	if !set {
		var err error
		// the data directory: the storages' directories are under it, and
		// exist only once something is stored
		if space, err = dfSpace(s.dataDir); err != nil {
			return nil, fail("storage '%s': %v", id, err)
		}
	}
	shared := 0
	if v, ok := c["shared"].(int); ok && v != 0 {
		shared = 1
	}
	active := 1
	if space.Inactive {
		active, space = 0, StorageSpace{}
	}
	return map[string]any{"type": c["type"], "content": c["content"], "shared": shared, "enabled": 1, "active": active,
		"total": space.Total, "avail": space.Avail, "used": space.Used}, nil
}

// dfSpace is the size of the file system holding path as pve-common's df
// reports it (Tools.pm df: Filesys::Df::df($path, 1), in bytes): its
// blocks, the blocks in use (Filesys::Df's used, blocks - bfree) and the
// blocks an unprivileged user may still use (bavail), in fragments
// (f_frsize, the unit statvfs counts blocks in).
func dfSpace(path string) (StorageSpace, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return StorageSpace{}, fmt.Errorf("df %s: %w", path, err)
	}
	bs := st.Frsize
	if bs == 0 {
		bs = st.Bsize
	}
	return StorageSpace{Total: int64(st.Blocks) * bs, Used: int64(st.Blocks-st.Bfree) * bs, Avail: int64(st.Bavail) * bs}, nil
}
