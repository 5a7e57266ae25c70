package pveemu

import (
	"context"
	"fmt"
	"syscall"
)

// StorageSpace is the size of a storage as its status reports it, bytes.
type StorageSpace struct {
	Total, Avail int64
}

// SetStorageSpace makes storage id report space from now on, whatever
// its file system holds (a test's full storage; df by default).
func (s *Server) SetStorageSpace(id string, space StorageSpace) {
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
// (Plugin.pm status, pve-common Tools.pm df: blocks, used, bavail); the
// emulator's local-lvm, whose volumes are files in the data directory,
// reports that file system's too (a guess: LvmThinPlugin.pm status
// reports the thin pool's lv_size and used). SetStorageSpace overrides
// both.
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
	return map[string]any{"type": c["type"], "content": c["content"], "shared": shared, "enabled": 1, "active": 1,
		"total": space.Total, "avail": space.Avail, "used": space.Total - space.Avail}, nil
}

// dfSpace is the size of the file system holding path, as df reports it
// (total blocks and the blocks an unprivileged user may still use).
func dfSpace(path string) (StorageSpace, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return StorageSpace{}, fmt.Errorf("df %s: %w", path, err)
	}
	bs := int64(st.Bsize)
	return StorageSpace{Total: int64(st.Blocks) * bs, Avail: int64(st.Bavail) * bs}, nil
}
