package pveemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func (s *Server) cloneVM(ctx context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid, newid := s.vmid(rq), rq.int("newid", 0)
	pool, snapname := rq.str("pool"), rq.str("snapname")
	if t := rq.str("target"); t != "" && t != s.node && t != "localhost" {
		return nil, fail("no such cluster node '%s'", t)
	}
	var fullParam *bool
	if rq.has("full") {
		f := rq.bool("full", false)
		fullParam = &f
	}
	loadAndCheck := func() (*vm, bool, error) {
		if pool != "" && s.pools[pool] == nil {
			return nil, false, permFail(fmt.Sprintf("pool '%s' does not exist", pool))
		}
		src, err := s.loadVM(vmid)
		if err != nil {
			return nil, false, err
		}
		if err := checkLock(src); err != nil {
			return nil, false, err
		}
		if snapname != "" && src.snaps[snapname] == nil {
			return nil, false, fail("snapshot '%s' does not exist", snapname)
		}
		full := src.conf["template"] != "1"
		if fullParam != nil {
			full = *fullParam
		}
		if rq.has("storage") && !full {
			return nil, false, fail("parameter 'storage' not allowed for linked clones")
		}
		if rq.has("format") && !full {
			return nil, false, fail("parameter 'format' not allowed for linked clones")
		}
		if _, exists := s.vms[newid]; exists {
			return nil, false, fail("unable to create VM %d: config file already exists", newid)
		}
		oldconf := src.conf
		if snapname != "" {
			oldconf = src.snaps[snapname].conf
		}
		if err := s.checkStorageAccessCloneLocked(rq.authid, oldconf, rq.str("storage")); err != nil {
			return nil, false, err
		}
		return src, full, nil
	}
	s.mu.Lock()
	_, _, err := loadAndCheck()
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	name, desc := rq.str("name"), rq.str("description")
	return s.startTask(rq.authid, "qmclone", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		if h := s.hooks.cloneTaskStart; h != nil {
			h(newid)
		}
		unlock, err := s.vmLock(ctx, newid, time.Second)
		if err != nil {
			return err
		}
		s.mu.Lock()
		src, full, err := loadAndCheck()
		if err != nil {
			s.mu.Unlock()
			unlock()
			return err
		}
		old := src.conf
		if snapname != "" {
			old = src.snaps[snapname].conf
		}
		newconf := map[string]string{}
		for k, val := range old {
			switch {
			case k == "parent" || k == "snaptime" || k == "vmstate" || k == "snapstate" || k == "template" || k == "lock" || strings.HasPrefix(k, "unused"):
				continue
			case strings.HasPrefix(k, "net"):
				val = setNetMAC(val, randomMAC())
			case reDiskKey.MatchString(k):
				if m := reVolume.FindStringSubmatch(val); m != nil {
					if full {
						val = fmt.Sprintf("%s:vm-%d-%s%s", m[1], newid, m[3], m[4])
					} else {
						val = fmt.Sprintf("%s:base-%d-%s/vm-%d-%s%s", m[1], vmid, m[3], newid, m[3], m[4])
					}
				}
			}
			newconf[k] = val
		}
		newconf["smbios1"] = "uuid=" + uuidish()
		if _, ok := newconf["vmgenid"]; ok {
			newconf["vmgenid"] = uuidish()
		}
		if name != "" {
			newconf["name"] = name
		} else {
			base := old["name"]
			if base == "" {
				base = strconv.Itoa(vmid)
			}
			newconf["name"] = "Copy-of-VM-" + base
		}
		if desc != "" {
			newconf["description"] = desc
		}
		// The temporary config ("lock: clone") makes the new VMID taken.
		s.vms[newid] = &vm{vmid: newid, conf: map[string]string{"lock": "clone"}, snaps: map[string]*snapshot{}}
		s.mu.Unlock()
		unlock()
		if h := s.hooks.cloneReserved; h != nil {
			h(newid)
		}
		t.logf("create %s clone of VM %d with ID %d", map[bool]string{true: "full", false: "linked"}[full], vmid, newid)
		t.logf("creating a clone of VM %d with ID %d", vmid, newid)
		srcDisk := s.DiskDir(vmid)
		if snapname != "" {
			srcDisk = filepath.Join(s.vmDir(vmid), "snap-"+snapname)
		}
		if err := copyDir(ctx, srcDisk, s.DiskDir(newid)); err != nil {
			_ = os.RemoveAll(s.vmDir(newid))
			s.mu.Lock()
			delete(s.vms, newid)
			s.mu.Unlock()
			return fmt.Errorf("clone failed: %w", err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		v := s.vms[newid]
		v.conf = newconf
		if err := s.ipamNICsLocked(newid, nil, newconf); err != nil {
			t.warn("%v", err) // create_ifaces_ipams_ips only warns
		}
		if pool != "" && s.pools[pool] != nil {
			v.pool = pool
			s.pools[pool].vms[newid] = true
		}
		return nil
	}), nil
}

// checkStorageAccessCloneLocked is qemu-server's
// $check_storage_access_clone (API2/Qemu.pm): every disk of the source
// needs Datastore.AllocateSpace on /storage/<sid>, the target storage
// replacing the disk's own when given.
func (s *Server) checkStorageAccessCloneLocked(authid string, conf map[string]string, target string) error {
	for _, k := range sortedKeys(conf) {
		if !reDiskKey.MatchString(k) {
			continue
		}
		sid := volumeStorage(conf[k])
		if sid == "" {
			continue
		}
		if target != "" {
			sid = target
		}
		if err := s.checkPrivsLocked(authid, "/storage/"+sid, []string{"Datastore.AllocateSpace"}); err != nil {
			return err
		}
	}
	return nil
}
