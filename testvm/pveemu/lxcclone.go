package pveemu

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ctCloneJob is one CT clone (POST .../lxc/{vmid}/clone): what clone_vm
// reads from its parameters and builds before its worker starts.
type ctCloneJob struct {
	vmid, newid int
	pool        string
	hostname    string
	desc        string
	storage     string
	full        bool
	running     bool // the source ran when the clone was built
	authid      string
	node        string
	newconf     map[string]string
	rootfsKey   string // "rootfs"
	srcVolume   string // the source's rootfs volume
}

// cloneCT is POST /nodes/{node}/lxc/{vmid}/clone (API2/LXC.pm clone_vm).
// Unlike qemu-server's, most of it runs before the worker, in the
// request: the source gets "lock: disk" (set_lock: a locked source, a
// second clone of it among them, fails "CT is locked (disk)"), the new
// VMID gets a config of its own with "lock: create"
// (create_and_lock_config: a taken id fails "CT 101 already exists on
// node 'pve'"), then the new config is built and written with that lock
// (a MAC of its own per NIC, SDN.Use on each bridge, Datastore.AllocateSpace
// on the volume's storage, full or linked as the source allows). Any
// failure there takes both locks back and answers the request. The
// vzclone worker makes the volume (a linked clone's own empty layer over
// the template's base; a full one a copy of the source's layer), adds
// the CT to its pool, gives its NICs their IPAM entries
// (create_ifaces_ipams_ips: a failure fails the clone), takes the
// source's lock back and, last, the new CT's.
func (s *Server) cloneCT(ctx context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	c := &ctCloneJob{vmid: s.vmid(rq), newid: rq.int("newid", 0), pool: rq.str("pool"), hostname: rq.str("hostname"),
		desc: rq.str("description"), storage: rq.str("storage"), authid: rq.authid, node: rq.str("node"), rootfsKey: "rootfs"}
	s.mu.Lock()
	if c.pool != "" && s.pools[c.pool] == nil {
		s.mu.Unlock()
		return nil, permFail(fmt.Sprintf("pool '%s' does not exist", c.pool))
	}
	target := rq.str("target")
	if target == c.node || target == "localhost" {
		target = ""
	}
	if target != "" && s.members[target] == nil {
		s.mu.Unlock()
		return nil, fail("no such cluster node '%s'", target)
	}
	if c.storage != "" && !s.storages[c.storage] {
		s.mu.Unlock()
		return nil, fail("storage '%s' does not exist", c.storage)
	}
	s.mu.Unlock()
	if err := s.ctSetLock(ctx, c.vmid, "disk"); err != nil {
		return nil, err
	}
	if err := s.ctCreateAndLock(ctx, c.node, c.newid); err != nil {
		s.ctRemoveLock(ctx, c.vmid, "disk")
		return nil, err
	}
	if err := s.ctBuildClone(ctx, c, rq, target); err != nil {
		s.ctRemoveLock(ctx, c.vmid, "disk")
		s.ctDestroyReserved(ctx, c.newid)
		return nil, err
	}
	return s.startTask(rq, "vzclone", strconv.Itoa(c.vmid), func(ctx context.Context, t *task) error {
		return s.runCTClone(ctx, t, c)
	}), nil
}

// ctSetLock is AbstractConfig set_lock: under the CT's config lock, its
// config loaded, its lock checked, the lock written.
func (s *Server) ctSetLock(ctx context.Context, vmid int, lock string) error {
	_, unlock, err := s.lockGuest(ctx, kindLXC, vmid, func(v *vm) error {
		if err := checkLock(v); err != nil {
			return err
		}
		v.conf["lock"] = lock
		return nil
	})
	if err != nil {
		return err
	}
	unlock()
	return nil
}

// ctRemoveLock is AbstractConfig remove_lock with a lock given; it only
// warns on failure (as clone_vm's callers do), so it returns nothing.
func (s *Server) ctRemoveLock(ctx context.Context, vmid int, lock string) {
	_, unlock, err := s.lockGuest(ctx, kindLXC, vmid, func(v *vm) error {
		if v.conf["lock"] != lock {
			return fail("found lock '%s' trying to remove '%s' lock", v.conf["lock"], lock)
		}
		delete(v.conf, "lock")
		return nil
	})
	if err == nil {
		unlock()
	}
}

// ctCreateAndLock is AbstractConfig create_and_lock_config without
// allow_existing: under the new id's config lock (5 s), the id free in
// the cluster (check_vmid_unused), a config of "lock: create" written.
func (s *Server) ctCreateAndLock(ctx context.Context, node string, newid int) error {
	unlock, err := s.guestLock(ctx, kindLXC, node, newid, 5*time.Second)
	if err != nil {
		return err
	}
	defer unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.vmidUnusedLocked(newid); err != nil {
		return err
	}
	s.vms[newid] = &vm{vmid: newid, kind: kindLXC, node: node, conf: map[string]string{"lock": "create"}, snaps: map[string]*snapshot{}}
	return nil
}

// ctDestroyReserved removes the config clone_vm wrote for the new id, if
// it still has the create lock (lock_and_reload, destroy_config).
func (s *Server) ctDestroyReserved(ctx context.Context, newid int) {
	_, unlock, err := s.lockGuest(ctx, kindLXC, newid, func(v *vm) error {
		if v.conf["lock"] != "create" {
			return fail("Lost 'create' config lock, aborting.")
		}
		delete(s.vms, newid)
		return nil
	})
	if err == nil {
		unlock()
	}
}

// ctBuildClone is clone_vm's eval before the worker: the new config built
// from the source's (read under its "disk" lock), with its checks, and
// written to the new id under its "create" lock.
func (s *Server) ctBuildClone(ctx context.Context, c *ctCloneJob, rq *request, target string) error {
	s.mu.Lock()
	src, err := s.loadGuest(kindLXC, c.vmid)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	running := s.ctPIDLockedOK(src)
	c.running = running
	template := src.conf["template"] == "1"
	c.full = !template
	if rq.has("full") {
		c.full = rq.bool("full", false)
	}
	newconf, err := s.ctCloneConfLocked(c, src.conf, running)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if target != "" {
		return fail("can't clone CT to node '%s' (CT uses local storage)", target)
	}
	c.newconf = newconf
	_, unlock, err := s.lockGuest(ctx, kindLXC, c.newid, func(v *vm) error {
		if v.conf["lock"] != "create" {
			return fail("Lost 'create' config lock, aborting.")
		}
		v.conf = copyConf(newconf)
		v.rootBase = src.rootBase
		return nil
	})
	if err != nil {
		return err
	}
	unlock()
	return nil
}

// ctPIDLockedOK reports whether a CT runs.
func (s *Server) ctPIDLockedOK(v *vm) bool { _, ok := s.ctPIDLocked(v); return ok }

// ctCloneConfLocked is clone_vm's loop over the source's options (sorted;
// unusedN skipped): rootfs and mount points need Datastore.AllocateSpace
// on their storage (the target storage when given) and a volume the
// storage can clone (a linked clone needs a template's base volume on the
// thin pool) or copy (a full clone of a running CT only from a
// snapshot); a NIC gets a new MAC and needs SDN.Use on its bridge;
// everything else is copied; then "lock: create", no snapshot keys, no
// pending, no template, and the hostname and description asked for.
func (s *Server) ctCloneConfLocked(c *ctCloneJob, src map[string]string, running bool) (map[string]string, error) {
	if c.storage != "" && !c.full {
		return nil, fail("parameter 'storage' not allowed for linked clones")
	}
	newconf := map[string]string{}
	for _, k := range sortedKeys(src) {
		val := src[k]
		switch {
		case reUnusedKey.MatchString(k):
			continue
		case k == "rootfs" || reMPKey.MatchString(k):
			if k != "rootfs" {
				return nil, fail("pveemu: cloning mount point '%s' is not emulated", k)
			}
			sid := volumeStorage(val)
			if c.storage != "" {
				sid = c.storage
			}
			if err := s.checkPrivsLocked(c.authid, "/storage/"+sid, []string{"Datastore.AllocateSpace"}); err != nil {
				return nil, err
			}
			vol, _, _ := strings.Cut(val, ",")
			if c.full && running {
				return nil, fail("Full clone of a running container is only possible from a snapshot")
			}
			if !c.full && (volumeStorage(val) != thinStorage || !strings.Contains(vol, ":base-") || strings.Contains(vol, "/")) {
				return nil, fail("Linked clone feature for '%s' is not available", vol)
			}
			c.srcVolume = val
			newconf[k] = val
		case reNetKey.MatchString(k):
			n := parseLXCNet(val)
			n["type"] = "veth"
			n["hwaddr"] = randomMAC()
			newconf[k] = n.String()
			if err := s.checkBridgeAccessLocked(c.authid, map[string]string{k: newconf[k]}); err != nil {
				return nil, err
			}
		default:
			newconf[k] = val
		}
	}
	for _, k := range []string{"parent", "snaptime", "snapstate", "template"} {
		delete(newconf, k)
	}
	newconf["lock"] = "create"
	if c.hostname != "" {
		newconf["hostname"] = c.hostname
	}
	if c.desc != "" {
		newconf["description"] = c.desc
	}
	return newconf, nil
}

// ctCloneVolume is the volume id of the new CT's rootfs: a linked clone's
// own thin volume on its template's base (LvmThinPlugin clone_image,
// base-<vmid>-disk-N/vm-<newid>-disk-N), a full clone's new one on the
// target storage.
func (c *ctCloneJob) ctCloneVolume() string {
	m := reCTVolume.FindStringSubmatch(c.srcVolume)
	if m == nil {
		return c.srcVolume
	}
	sid, disk, opts := m[1], m[2], m[3]
	if c.full {
		if c.storage != "" {
			sid = c.storage
		}
		return fmt.Sprintf("%s:vm-%d-%s%s", sid, c.newid, disk, opts)
	}
	vol, _, _ := strings.Cut(c.srcVolume, ",")
	_, base, _ := strings.Cut(vol, ":")
	return fmt.Sprintf("%s:%s/vm-%d-%s%s", sid, base, c.newid, disk, opts)
}

// runCTClone is clone_vm's worker. The source must run as it did when
// the clone was built ("unexpected state change"): a full clone copies a
// stopped CT's volume (of a running one it is refused before, as
// pve-container refuses one without a snapshot), so a CT started since
// (a start with skiplock passes the source's "lock: disk") fails it
// rather than being copied live. That check dies before the worker's
// eval, so nothing is cleaned up: the source keeps "lock: disk" and the
// new CT its config with "lock: create".
func (s *Server) runCTClone(ctx context.Context, t *task, c *ctCloneJob) (err error) {
	t.logf("creating a clone of container %d with ID %d", c.vmid, c.newid)
	if h := s.hooks.cloneReserved; h != nil {
		h(c.node, c.newid)
	}
	if s.ctRunning(c.vmid) != c.running {
		return fail("unexpected state change")
	}
	defer func() {
		s.ctRemoveLock(context.WithoutCancel(ctx), c.vmid, "disk") // in any case
		if err != nil {
			_ = os.RemoveAll(s.vmDir(c.newid))
			s.mu.Lock()
			if v := s.vms[c.newid]; v != nil {
				_ = s.ipamNICsOfLocked(c.newid, v.conf, nil, lxcNetMAC, "")
				if p := s.pools[v.pool]; p != nil {
					delete(p.vms, c.newid)
				}
			}
			s.mu.Unlock()
			s.ctDestroyReserved(context.WithoutCancel(ctx), c.newid)
			err = fmt.Errorf("clone failed: %w", err)
		}
	}()
	volume := c.ctCloneVolume()
	if c.full {
		t.logf("create full clone of mountpoint %s (%s)", c.rootfsKey, strings.SplitN(c.srcVolume, ",", 2)[0])
		if err := copyDir(ctx, s.DiskDir(c.vmid), s.DiskDir(c.newid)); err != nil {
			return err
		}
	} else {
		t.logf("create linked clone of mount point %s (%s)", c.rootfsKey, strings.SplitN(c.srcVolume, ",", 2)[0])
		if err := os.MkdirAll(s.DiskDir(c.newid), 0o755); err != nil {
			return err
		}
	}
	_, unlock, err := s.lockGuest(ctx, kindLXC, c.newid, func(v *vm) error {
		if v.conf["lock"] != "create" {
			return fail("Lost 'create' config lock, aborting.")
		}
		v.conf[c.rootfsKey] = volume
		if c.pool != "" && s.pools[c.pool] != nil {
			v.pool = c.pool
			s.pools[c.pool].vms[c.newid] = true
		}
		return s.ipamNICsOfLocked(c.newid, nil, v.conf, lxcNetMAC, v.conf["hostname"])
	})
	if err != nil {
		return err
	}
	unlock()
	s.ctRemoveLock(ctx, c.newid, "create")
	return nil
}
