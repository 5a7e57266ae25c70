package pveemu

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// storageConfig is the storage.cfg section of a storage of the emulated
// node: "local" is a fresh node's dir storage (content iso,vztmpl,backup:
// no images, as the installer writes it), "local-lvm" its LVM-thin pool.
func (s *Server) storageConfig(id string) map[string]any {
	switch id {
	case "local":
		return map[string]any{"storage": id, "type": "dir", "path": s.reportedPath(s.storageDir()),
			"content": s.storageContentLocked(id, "backup,iso,vztmpl"), "shared": 0}
	case "local-lvm":
		return map[string]any{"storage": id, "type": "lvmthin", "vgname": "pve", "thinpool": "data",
			"content": s.storageContentLocked(id, "images,rootdir")}
	}
	return nil
}

// storageContentLocked is the storage's content list: the default, or
// what SetStorageContent set.
func (s *Server) storageContentLocked(id, def string) string {
	if c, ok := s.storageContent[id]; ok {
		return c
	}
	return def
}

// SetStorageContent sets a storage's content types (pvesm set ID
// --content LIST), e.g. to let the dir storage hold VM images.
func (s *Server) SetStorageContent(id, content string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.storageContent[id] = content
}

// listStorage is GET /storage: the storage.cfg sections the caller may see
// (Datastore.Audit or Datastore.AllocateSpace on /storage/ID; pve-storage
// API2/Storage/Config.pm index).
func (s *Server) listStorage(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, c := range s.visibleStoragesLocked(rq.authid) {
		if rq.str("type") == "" || c["type"] == rq.str("type") {
			out = append(out, c)
		}
	}
	return out, nil
}

// visibleStoragesLocked returns the storage.cfg sections of the storages
// authid has Datastore.Audit or Datastore.AllocateSpace on, by id.
func (s *Server) visibleStoragesLocked(authid string) []map[string]any {
	var out []map[string]any
	for _, id := range sortedKeys(s.storages) {
		have := s.privilegesLocked(authid, "/storage/"+id)
		if c := s.storageConfig(id); c != nil && (have["Datastore.Audit"] || have["Datastore.AllocateSpace"]) {
			out = append(out, c)
		}
	}
	return out
}

// nodeStorage is GET /nodes/{node}/storage: the storages enabled on the
// node that the caller may see (pve-storage API2/Storage/Status.pm
// index), active unless SetStorageSpace made one inactive; sizes are not
// emulated.
func (s *Server) nodeStorage(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, c := range s.visibleStoragesLocked(rq.authid) {
		id := c["storage"].(string)
		if sid := rq.str("storage"); sid != "" && sid != id {
			continue
		}
		if want := rq.str("content"); want != "" && !slices.Contains(strings.Split(c["content"].(string), ","), want) {
			continue
		}
		active := 1
		if s.storageSpace[id].Inactive { // SetStorageSpace: storage_info's active 0
			active = 0
		}
		out = append(out, map[string]any{"storage": id, "type": c["type"], "content": c["content"], "active": active, "enabled": 1, "shared": 0})
	}
	return out, nil
}

// effectivePermissions is GET /access/permissions (pve-access-control
// API2/AccessControl.pm permissions; RPCEnvironment.pm
// get_effective_permissions): a map path -> privilege -> propagate of
// userid (default: the caller). A user may read its own and its tokens';
// another's needs Sys.Audit on /access. With path, just that path;
// without, the top-level paths, every ACL path and the pools' paths and
// members.
func (s *Server) effectivePermissions(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	who := rq.str("userid")
	if who == "" {
		who = rq.authid
	}
	callerUser, _, _ := strings.Cut(rq.authid, "!")
	whoUser, _, whoIsToken := strings.Cut(who, "!")
	own := who == rq.authid || !strings.Contains(rq.authid, "!") && whoIsToken && whoUser == callerUser
	if !own && !s.privilegesLocked(rq.authid, "/access")["Sys.Audit"] {
		return nil, permFail("/access, Sys.Audit")
	}
	privsOf := func(path string) map[string]any {
		out := map[string]any{}
		for p := range s.privilegesLocked(who, path) {
			out[p] = 1
		}
		return out
	}
	if p := rq.str("path"); p != "" {
		return map[string]any{p: privsOf(normalizePath(p))}, nil
	}
	paths := map[string]bool{"/": true, "/access": true, "/access/groups": true, "/nodes": true, "/pool": true, "/sdn": true, "/storage": true, "/vms": true}
	for _, e := range s.acl {
		paths[e.path] = true
	}
	for id, p := range s.pools {
		paths["/pool/"+id] = true
		for vmid := range p.vms {
			paths["/vms/"+strconv.Itoa(vmid)] = true
		}
		for sid := range p.storage {
			paths["/storage/"+sid] = true
		}
	}
	res := map[string]any{}
	for p := range paths {
		if m := privsOf(p); len(m) > 0 {
			res[p] = m
		}
	}
	return res, nil
}

// listContent is GET /nodes/{node}/storage/{storage}/content: the thin
// pool's images (listThinContent), or the VM images of the dir storage (the schema's Datastore.Audit or
// Datastore.AllocateSpace on the storage is checked before), each only
// when check_volume_access lets the caller see it (Datastore.Allocate on
// the storage, else VM.Config.Disk on its owner; pve-storage
// API2/Storage/Content.pm index); vmid and content filter.
func (s *Server) listContent(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	if rq.str("storage") == thinStorage {
		return s.listThinContent(rq)
	}
	out := []map[string]any{}
	if rq.str("storage") != dirStorage {
		return out, nil
	}
	// pve-storage volume_list lists only the content types the storage
	// is configured for: a dir storage without "images" (a fresh node's
	// "local") shows no VM image, whatever is in its images directory.
	s.mu.Lock()
	configured := map[string]bool{}
	for _, c := range strings.Split(s.storageContentLocked(dirStorage, "backup,iso,vztmpl"), ",") {
		configured[strings.TrimSpace(c)] = true
	}
	s.mu.Unlock()
	if c := rq.str("content"); c != "" && !configured[c] {
		return out, nil
	}
	if c := rq.str("content"); c != "" && c != "images" {
		if _, ok := vtypeSubdir[c]; !ok {
			return out, nil
		}
		files, err := s.listDirContent(c)
		if err != nil {
			return nil, err
		}
		return append(out, files...), nil
	}
	if !rq.has("content") && !rq.has("vmid") {
		// every content type of the storage, not only images
		for _, c := range []string{"iso", "vztmpl", "backup", "snippets", "import"} {
			if !configured[c] {
				continue
			}
			files, err := s.listDirContent(c)
			if err != nil {
				return nil, err
			}
			out = append(out, files...)
		}
	}
	if !configured["images"] {
		return out, nil
	}
	dirs, err := os.ReadDir(filepath.Join(s.storageDir(), "images"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fail("%v", err)
	}
	for _, d := range dirs {
		owner, err := strconv.Atoi(d.Name())
		if err != nil || rq.has("vmid") && rq.int("vmid", 0) != owner {
			continue
		}
		files, _ := os.ReadDir(filepath.Join(s.storageDir(), "images", d.Name()))
		for _, f := range files {
			if !reImageName.MatchString(f.Name()) || s.checkVolumeAccess(rq.authid, dirStorage, owner) != nil {
				continue
			}
			info, err := f.Info()
			if err != nil {
				continue
			}
			format, size := "raw", info.Size()
			if m := reImageName.FindStringSubmatch(f.Name()); m != nil {
				format = m[2]
			}
			if ii, err := probeImage(filepath.Join(s.storageDir(), "images", d.Name(), f.Name()), format); err == nil {
				size = ii.size // list_images: file_size_info's virtual size
			}
			out = append(out, map[string]any{"volid": dirStorage + ":" + d.Name() + "/" + f.Name(), "vmid": owner, "format": format,
				"size": size, "used": info.Size(), "content": "images", "ctime": info.ModTime().Unix()})
		}
	}
	return out, nil
}
