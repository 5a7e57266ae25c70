package pveemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// cloneJob is one clone (POST .../clone): what clone_vm reads from its
// parameters, checked before the worker starts and again inside it.
type cloneJob struct {
	vmid, newid    int
	pool, snapname string
	name, desc     string
	storage        string
	hasStorage     bool
	hasFormat      bool
	full           *bool // the full parameter; nil when not given
	authid         string
	node           string // the node whose API was called (the path's)
}

func (s *Server) cloneVM(ctx context.Context, rq *request) (any, error) {
	// Not openVM: clone_vm checks the pool before it loads the source.
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	c := &cloneJob{vmid: s.vmid(rq), newid: rq.int("newid", 0), pool: rq.str("pool"), snapname: rq.str("snapname"),
		name: rq.str("name"), desc: rq.str("description"), storage: rq.str("storage"),
		hasStorage: rq.has("storage"), hasFormat: rq.has("format"), authid: rq.authid, node: rq.str("node")}
	if t := rq.str("target"); t != "" && t != rq.str("node") && t != "localhost" {
		return nil, fail("no such cluster node '%s'", t)
	}
	if rq.has("full") {
		f := rq.bool("full", false)
		c.full = &f
	}
	s.mu.Lock()
	_, _, err := s.cloneSourceLocked(c)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.startTask(rq, "qmclone", strconv.Itoa(c.vmid), func(ctx context.Context, t *task) error {
		return s.runClone(ctx, t, c)
	}), nil
}

// cloneSourceLocked makes clone_vm's checks of the pool, the source and the
// new VMID, and returns the config the clone copies (the source's, or its
// snapshot's) and whether the clone is full.
func (s *Server) cloneSourceLocked(c *cloneJob) (map[string]string, bool, error) {
	if c.pool != "" && s.pools[c.pool] == nil {
		return nil, false, permFail(fmt.Sprintf("pool '%s' does not exist", c.pool))
	}
	src, err := s.loadVM(c.vmid)
	if err != nil {
		return nil, false, err
	}
	if err := checkLock(src); err != nil {
		return nil, false, err
	}
	if c.snapname != "" && src.snaps[c.snapname] == nil {
		return nil, false, fail("snapshot '%s' does not exist", c.snapname)
	}
	full := src.conf["template"] != "1"
	if c.full != nil {
		full = *c.full
	}
	if c.hasStorage && !full {
		return nil, false, fail("parameter 'storage' not allowed for linked clones")
	}
	if c.hasFormat && !full {
		return nil, false, fail("parameter 'format' not allowed for linked clones")
	}
	// clone_vm checks the new id's config file on this node only
	// (PVE::QemuConfig->config_file: /etc/pve/nodes/<local>/qemu-server/...);
	// another node's VM of that id, or a CT of it on any node, is found
	// only when pmxcfs refuses the rename of the temporary config
	// (runClone).
	if v, exists := s.vms[c.newid]; exists && v.kind == kindQemu && s.vmNodeLocked(v) == c.node {
		return nil, false, fail("unable to create VM %d: config file already exists", c.newid)
	}
	oldconf := src.conf
	if c.snapname != "" {
		oldconf = src.snaps[c.snapname].conf
	}
	if err := s.checkStorageAccessCloneLocked(c.authid, oldconf, c.storage); err != nil {
		return nil, false, err
	}
	if err := s.checkBridgeAccessLocked(c.authid, oldconf); err != nil {
		return nil, false, err
	}
	return oldconf, full, nil
}

// runClone is the clone's worker: it reserves the new VMID under its
// config lock, copies the disk, then gives the new VM its config, its
// NICs' IPAM entries and its pool.
func (s *Server) runClone(ctx context.Context, t *task, c *cloneJob) error {
	if h := s.hooks.cloneTaskStart; h != nil {
		h(c.newid)
	}
	unlock, err := s.vmLock(ctx, c.node, c.newid, time.Second) // this node's lock file: another node's clone of the id takes its own
	if err != nil {
		return err
	}
	s.mu.Lock()
	old, full, err := s.cloneSourceLocked(c)
	if err != nil {
		s.mu.Unlock()
		unlock()
		return err
	}
	newconf := c.conf(old, full)
	if _, exists := s.vms[c.newid]; exists {
		// Another node has a VM of that id: file_set_contents' rename
		// of the temporary config fails in pmxcfs (EEXIST: the id is
		// in the cluster's vmlist), and the task with it.
		s.mu.Unlock()
		unlock()
		return fmt.Errorf("close (rename) atomic file '/etc/pve/nodes/%s/qemu-server/%d.conf' failed: File exists", c.node, c.newid)
	}
	// The temporary config ("lock: clone") makes the new VMID taken.
	s.vms[c.newid] = &vm{vmid: c.newid, node: s.vms[c.vmid].node, conf: map[string]string{"lock": "clone"}, snaps: map[string]*snapshot{}}
	reserved := s.hooks.cloneReserved
	s.mu.Unlock()
	unlock()
	if reserved != nil {
		reserved(c.node, c.newid)
	}
	t.logf("create %s clone of VM %d with ID %d", map[bool]string{true: "full", false: "linked"}[full], c.vmid, c.newid)
	t.logf("creating a clone of VM %d with ID %d", c.vmid, c.newid)
	srcDisk := s.DiskDir(c.vmid)
	if c.snapname != "" {
		srcDisk = filepath.Join(s.vmDir(c.vmid), "snap-"+c.snapname)
	}
	if err := copyDir(ctx, srcDisk, s.DiskDir(c.newid)); err != nil {
		_ = os.RemoveAll(s.vmDir(c.newid))
		s.mu.Lock()
		delete(s.vms, c.newid)
		s.mu.Unlock()
		return fmt.Errorf("clone failed: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.vms[c.newid]
	v.conf = newconf
	if err := s.ipamNICsLocked(c.newid, nil, newconf); err != nil {
		t.warn("%v", err) // create_ifaces_ipams_ips only warns
	}
	if c.pool != "" && s.pools[c.pool] != nil {
		v.pool = c.pool
		s.pools[c.pool].vms[c.newid] = true
	}
	return nil
}

// conf is the new VM's config made from old: without the snapshot,
// template, lock and unused keys, with new MACs, the disks renamed (a
// linked clone's on its base), a new smbios uuid and vmgenid, and the name
// and description asked for.
func (c *cloneJob) conf(old map[string]string, full bool) map[string]string {
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
					val = fmt.Sprintf("%s:vm-%d-%s%s", m[1], c.newid, m[3], m[4])
				} else {
					val = fmt.Sprintf("%s:base-%d-%s/vm-%d-%s%s", m[1], c.vmid, m[3], c.newid, m[3], m[4])
				}
			}
		}
		newconf[k] = val
	}
	newconf["smbios1"] = "uuid=" + uuidish()
	if _, ok := newconf["vmgenid"]; ok {
		newconf["vmgenid"] = uuidish()
	}
	if c.name != "" {
		newconf["name"] = c.name
	} else {
		base := old["name"]
		if base == "" {
			base = strconv.Itoa(c.vmid)
		}
		newconf["name"] = "Copy-of-VM-" + base
	}
	if c.desc != "" {
		newconf["description"] = c.desc
	}
	return newconf
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

// HoldClones makes every clone task stop after it wrote its temporary
// config ("lock: clone") until release is called, and sends each held
// VMID on held (buffered; extra sends are dropped): a clone that runs on
// after its caller is gone, as qemu-server's clone_vm does. A CT clone's
// task stops at its start, both its locks set (lxcclone.go). Clones that
// reach that point before the call run through.
func (s *Server) HoldClones() (held <-chan int, release func()) { return s.HoldClonesOn("") }

// HoldClonesOn is HoldClones for the clones that run on node only (the
// node of the clone call's path, where clone_vm runs); the other nodes'
// clones run through. "" holds every node's. A later call replaces the
// hold (an earlier one's clones stay held until its release).
func (s *Server) HoldClonesOn(node string) (held <-chan int, release func()) {
	ch := make(chan int, 16)
	gate := make(chan struct{})
	var once sync.Once
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hooks.cloneReserved = func(on string, id int) {
		if node != "" && on != node {
			return
		}
		select {
		case ch <- id:
		default:
		}
		<-gate
	}
	return ch, func() { once.Do(func() { close(gate) }) }
}
