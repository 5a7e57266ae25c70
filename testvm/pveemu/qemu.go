package pveemu

import (
	"context"
	"crypto/sha1"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// vm is a guest: a QEMU VM, or a container (kind kindLXC, lxc.go); both
// share one VMID space, as pmxcfs's vmlist does.
type vm struct {
	vmid    int
	kind    guestKind
	node    string // the node its config is on ("" for the primary)
	conf    map[string]string
	running bool
	started time.Time
	pool    string
	snaps   map[string]*snapshot
	// pending holds changes a running VM could not hot-plug, and
	// pendingDel the keys whose deletion waits (qemu-server's [PENDING]
	// section, qemudisk.go): disks of a VM whose hotplug lacks disk, and
	// disks whose hot-plug or unplug failed.
	pending    map[string]string
	pendingDel map[string]bool
	// rootBase is a CT's base volume: the root its own volume (DiskDir)
	// is overlaid on, shared with its template (lxc.go); "" for a VM.
	rootBase string
	// unseen are the SCSI slots hot-plugged into the running VM whose
	// controller told the guest nothing (scsiHotplugSeen): in QEMU, not
	// in the guest. Cleared when the VM starts or stops.
	unseen map[string]bool
}

type snapshot struct {
	name        string
	description string
	snaptime    int64
	parent      string
	conf        map[string]string
	// state is the snapshot's snapstate: "prepare" while a CT's
	// snapshot is taken (lxcsnapshot.go), "" once committed.
	state string
}

// createOnlyParams are create/clone parameters that are not config keys.
var createOnlyParams = map[string]bool{
	"node": true, "vmid": true, "pool": true, "start": true, "storage": true, "archive": true,
	"force": true, "unique": true, "live-restore": true, "bwlimit": true, "import-working-storage": true, "ha-managed": true,
}

var (
	reDiskKey  = regexp.MustCompile(`^(ide|sata|scsi|virtio|efidisk|tpmstate)\d+$`)
	reNewDisk  = regexp.MustCompile(`^([a-zA-Z][a-zA-Z0-9\-_.]*[a-zA-Z0-9]):(\d+(?:\.\d+)?)(,.*)?$`)
	reVolume   = regexp.MustCompile(`^([^:]+):(?:base-\d+-disk-\d+/)?(?:vm|base)-(\d+)-(disk-\d+)(.*)$`)
	reNetModel = regexp.MustCompile(`^([a-z0-9_-]+)(?:=([0-9A-Fa-f:]{17}))?$`)
	reNetKey   = regexp.MustCompile(`^net\d+$`)
)

// guestKind is a guest's type, as pmxcfs's vmlist records it: it decides
// its config directory, its config lock and the word its errors use.
type guestKind int

const (
	kindQemu guestKind = iota // qemu-server
	kindLXC                   // pve-container
)

// confDir is the kind's directory below /etc/pve/nodes/<node>.
func (k guestKind) confDir() string {
	if k == kindLXC {
		return "lxc"
	}
	return "qemu-server"
}

// label is what pve-guest-common's errors call the kind
// (AbstractConfig guest_type: QemuConfig "VM", LXC::Config "CT").
func (k guestKind) label() string {
	if k == kindLXC {
		return "CT"
	}
	return "VM"
}

// lockFile is the kind's config lock file (QemuConfig config_file_lock,
// LXC::Config config_file_lock).
func (k guestKind) lockFile(vmid int) string {
	if k == kindLXC {
		return fmt.Sprintf("/run/lock/lxc/pve-config-%d.lock", vmid)
	}
	return fmt.Sprintf("/var/lock/qemu-server/lock-%d.conf", vmid)
}

// resourceType is the kind's type in /cluster/resources and pools.
func (k guestKind) resourceType() string {
	if k == kindLXC {
		return "lxc"
	}
	return "qemu"
}

// cfsPathOf is load_config's path of a kind's config on the primary node.
func (s *Server) cfsPathOf(k guestKind, vmid int) string {
	return fmt.Sprintf("nodes/%s/%s/%d.conf", s.node, k.confDir(), vmid)
}

// vmDir is the per-VM state directory; its "disk" subdirectory is the
// guest's disk and "snap-<name>" hold snapshot copies.
func (s *Server) vmDir(vmid int) string {
	return filepath.Join(s.dataDir, "images", strconv.Itoa(vmid))
}

// DiskDir is the disk directory of a VM.
func (s *Server) DiskDir(vmid int) string { return filepath.Join(s.vmDir(vmid), "disk") }

func (s *Server) loadVM(vmid int) (*vm, error) { return s.loadGuest(kindQemu, vmid) }

// loadGuest is load_config of a kind: a guest of another kind has no
// config file in this kind's directory.
func (s *Server) loadGuest(k guestKind, vmid int) (*vm, error) {
	v := s.vms[vmid]
	if v == nil || v.kind != k {
		return nil, fail("Configuration file '%s' does not exist", s.cfsPathOf(k, vmid))
	}
	return v, nil
}

// checkLock is AbstractConfig check_lock: "VM is locked (clone)", "CT is
// locked (disk)".
func checkLock(v *vm) error {
	if l := v.conf["lock"]; l != "" {
		return fail("%s is locked (%s)", v.kind.label(), l)
	}
	return nil
}

// lockKey names a lock file of a node (a config lock, the migration
// lock): the flock on the kind's config lock file
// (/var/lock/qemu-server/lock-<vmid>.conf, /run/lock/lxc/pve-config-<vmid>.lock)
// is a file of one node's local filesystem, so two nodes hold "the same"
// lock at once, and a VM's and a CT's lock of one VMID are two files.
type lockKey struct {
	node string
	file string
}

// vmLock is the per-VM config lock of node (flock on lock-<vmid>.conf on
// that node: node-local, pve-guest-common AbstractConfig config_file_lock,
// qemu-server QemuConfig "/var/lock/qemu-server").
func (s *Server) vmLock(ctx context.Context, node string, vmid int, timeout time.Duration) (func(), error) {
	return s.guestLock(ctx, kindQemu, node, vmid, timeout)
}

// guestLock is a kind's config lock (lock_config_full with timeout):
// "can't lock file '<lock file>' - got timeout" when it is not had in
// time.
func (s *Server) guestLock(ctx context.Context, kind guestKind, node string, vmid int, timeout time.Duration) (func(), error) {
	return s.flock(ctx, node, kind.lockFile(vmid), timeout, nil)
}

// flock is pve-common Tools.pm lock_file_full on node's file (an
// exclusive flock): "can't lock file '<file>' - got timeout" when it is
// not had in time. waiting, when set, runs once when the lock is not free
// at once (lock_file_full prints "trying to acquire lock...").
func (s *Server) flock(ctx context.Context, node, file string, timeout time.Duration, waiting func()) (func(), error) {
	s.mu.Lock()
	k := lockKey{node, file}
	m := s.vmLocks[k]
	if m == nil {
		m = &sync.Mutex{}
		s.vmLocks[k] = m
	}
	s.mu.Unlock()
	deadline := time.Now().Add(timeout)
	for !m.TryLock() {
		if waiting != nil {
			waiting()
			waiting = nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fail("can't lock file '%s' - got timeout", file)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return m.Unlock, nil
}

func (s *Server) checkNode(rq *request) error {
	// s.members is fixed once New returns: no lock (callers may hold s.mu).
	if n := rq.str("node"); n != "" && s.members[n] == nil {
		return fail("hostname lookup '%s' failed - failed to get address info for: %s: Name or service not known", n, n)
	}
	return nil
}

// openVM is the opening the VM handlers share, in qemu-server's order:
// the node check; then params, the handler's checks of its own parameters
// (nil for none); then, unless onVM is nil, the VM's config loaded under
// s.mu and onVM run on it before s.mu is released: the checks a handler
// makes before it answers or starts its worker, and the reads its answer
// needs. A nil onVM is for handlers whose worker loads the config itself
// (qmstop, a synchronous config update); vmExists is the onVM of those
// that need only the VM to exist. The config lock (vmLock) is not taken
// here: the workers take it.
func (s *Server) openVM(rq *request, params func(*request) error, onVM func(*vm) error) error {
	return s.openGuest(kindQemu, rq, params, onVM)
}

// openGuest is openVM for a guest of kind k.
func (s *Server) openGuest(k guestKind, rq *request, params func(*request) error, onVM func(*vm) error) error {
	if err := s.checkNode(rq); err != nil {
		return err
	}
	if params != nil {
		if err := params(rq); err != nil {
			return err
		}
	}
	if onVM == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.loadGuest(k, s.vmid(rq))
	if err != nil {
		return err
	}
	return onVM(v)
}

// lockVM is the opening of the VM workers: the VM's config lock
// (vmLock, 10 s), then, under s.mu, the VM loaded and check run on it
// before s.mu is released. On success it returns the VM and the config
// lock still held, for the caller to release with the unlock returned; on
// failure both locks are released already.
func (s *Server) lockVM(ctx context.Context, vmid int, check func(*vm) error) (*vm, func(), error) {
	return s.lockGuest(ctx, kindQemu, vmid, check)
}

// lockGuest is lockVM for a guest of kind k (its config lock, its config
// directory).
func (s *Server) lockGuest(ctx context.Context, kind guestKind, vmid int, check func(*vm) error) (*vm, func(), error) {
	// the lock of the node the VM's config is on (the primary's for a
	// VM that does not exist: the check below refuses it)
	s.mu.Lock()
	node := s.node
	if v := s.vms[vmid]; v != nil {
		node = s.vmNodeLocked(v)
	}
	s.mu.Unlock()
	unlock, err := s.guestLock(ctx, kind, node, vmid, 10*time.Second)
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	v, err := s.loadGuest(kind, vmid)
	if err == nil {
		err = check(v)
	}
	s.mu.Unlock()
	if err != nil {
		unlock()
		return nil, nil, err
	}
	return v, unlock, nil
}

// vmidUnusedLocked is pve-cluster's check_vmid_unused: the id is free
// in the cluster's vmlist, whatever kind holds it ("CT 101 already
// exists on node 'pve'").
func (s *Server) vmidUnusedLocked(vmid int) error {
	if v := s.vms[vmid]; v != nil {
		return fail("%s %d already exists on node '%s'", v.kind.label(), vmid, s.vmNodeLocked(v))
	}
	return nil
}

// vmExists is the onVM of openVM for handlers that need only the VM.
func vmExists(*vm) error { return nil }

// checkSkiplock refuses skiplock to anyone but root@pam, as the
// qemu-server handlers do before they touch the VM.
func checkSkiplock(rq *request) error {
	if rq.bool("skiplock", false) && rq.authid != "root@pam" {
		return paramFail(ParamErrors{"skiplock": "Only root may use this option."})
	}
	return nil
}

func copyDir(ctx context.Context, src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dst, err)
	}
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("disk source: %w", err)
	}
	out, err := exec.CommandContext(ctx, "cp", "-a", "--", src+"/.", dst+"/").CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s to %s: %v: %s", src, dst, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func randomMAC() string {
	b := []byte(randomHex(3))
	return strings.ToUpper(fmt.Sprintf("BC:24:11:%s:%s:%s", b[0:2], b[2:4], b[4:6]))
}

// netMAC returns net0-style (model=MAC,bridge=...) MAC and bridge.
func parseNet(value string) (mac, bridge string) {
	for _, part := range strings.Split(value, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch {
		case k == "bridge":
			bridge = v
		case k == "macaddr":
			mac = v
		case reNetModel.MatchString(part) && !strings.Contains(k, "bridge"):
			if m := reNetModel.FindStringSubmatch(part); m != nil && m[2] != "" {
				mac = m[2]
			}
		}
	}
	return mac, bridge
}

func setNetMAC(value, mac string) string {
	parts := strings.Split(value, ",")
	for i, part := range parts {
		k, v, hasEq := strings.Cut(part, "=")
		if k == "macaddr" {
			parts[i] = "macaddr=" + mac
			return strings.Join(parts, ",")
		}
		if i == 0 && !strings.Contains(part, "bridge") && (hasEq && len(v) == 17 || !hasEq) {
			parts[i] = k + "=" + mac
			return strings.Join(parts, ",")
		}
	}
	return value + ",macaddr=" + mac
}

func confDigest(conf map[string]string) string {
	h := sha1.New()
	for _, k := range sortedKeys(conf) {
		fmt.Fprintf(h, "%s: %s\n", k, conf[k])
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

func copyConf(c map[string]string) map[string]string {
	out := make(map[string]string, len(c))
	for k, v := range c {
		out[k] = v
	}
	return out
}

// AddTemplate registers a stopped template VM whose disk is diskDir
// (copied into the emulator's data dir, so diskDir is left untouched).
// conf holds extra config keys (e.g. "net0", "agent"); name, a scsi0 disk
// and template=1 are set unless given, and a key given as "" is left out
// (a template with its disk on ide0 and no scsi0, or no agent key).
func (s *Server) AddTemplate(ctx context.Context, vmid int, name, diskDir string, conf map[string]string) error {
	if err := namedFormats["pve-vmid"](strconv.Itoa(vmid)); err != nil {
		return fmt.Errorf("pveemu: add template: vmid %d: %s", vmid, strings.TrimSpace(err.Error()))
	}
	s.mu.Lock()
	if _, ok := s.vms[vmid]; ok {
		s.mu.Unlock()
		return fmt.Errorf("pveemu: add template: VM %d already exists", vmid)
	}
	s.mu.Unlock()
	if err := copyDir(ctx, diskDir, s.DiskDir(vmid)); err != nil {
		return fmt.Errorf("pveemu: add template: %w", err)
	}
	c := map[string]string{"name": name, "scsi0": fmt.Sprintf("local-lvm:base-%d-disk-0,size=8G", vmid), "template": "1",
		"memory": "512", "cores": "1", "ostype": "l26", "scsihw": "virtio-scsi-single", "agent": "1",
		"smbios1": "uuid=" + uuidish(), "vmgenid": uuidish()}
	for k, v := range conf {
		c[k] = v
		if v == "" {
			delete(c, k)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.vms[vmid]; ok {
		return fmt.Errorf("pveemu: add template: VM %d already exists", vmid)
	}
	s.vms[vmid] = &vm{vmid: vmid, conf: c, snaps: map[string]*snapshot{}}
	return nil
}

func uuidish() string {
	return fmt.Sprintf("%s-%s-%s-%s-%s", randomHex(4), randomHex(2), randomHex(2), randomHex(2), randomHex(6))
}

// ---- handlers ----

func (s *Server) vmid(rq *request) int { return rq.int("vmid", 0) }

func (s *Server) listVMs(_ context.Context, rq *request) (any, error) {
	return s.listGuests(rq, kindQemu)
}

// listGuests is the node's list of one kind (qemu-server and
// pve-container vmlist): the status of each guest of the kind on the
// node, only those with VM.Audit on /vms/<vmid>.
func (s *Server) listGuests(rq *request, kind guestKind) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, id := range sortedVMIDs(s.vms) {
		v := s.vms[id]
		if v.kind != kind || s.vmNodeLocked(v) != rq.str("node") || !s.privilegesLocked(rq.authid, fmt.Sprintf("/vms/%d", id))["VM.Audit"] {
			continue
		}
		out = append(out, s.guestStatusLocked(v))
	}
	return out, nil
}

func sortedVMIDs(m map[int]*vm) []int {
	ids := make([]int, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids
}

func (s *Server) vmIndex(_ context.Context, rq *request) (any, error) {
	if err := s.openVM(rq, nil, vmExists); err != nil {
		return nil, err
	}
	out := []map[string]any{}
	for _, n := range []string{"config", "pending", "status", "unlink", "vncproxy", "termproxy", "migrate", "resize", "move", "rrd", "rrddata", "monitor", "agent", "snapshot", "spiceproxy", "sendkey", "firewall", "mtunnel", "remote_migrate"} {
		out = append(out, map[string]any{"subdir": n})
	}
	return out, nil
}

func (s *Server) createVM(ctx context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid := s.vmid(rq)
	pool := rq.str("pool")
	if pool != "" {
		if err := s.checkPrivs(rq.authid, "/pool/"+pool, []string{"VM.Allocate"}, false); err != nil {
			return nil, err
		}
	} else if err := s.checkPrivs(rq.authid, fmt.Sprintf("/vms/%d", vmid), []string{"VM.Allocate"}, false); err != nil {
		return nil, err
	}
	conf := map[string]string{}
	params := map[string]string{}
	for k := range rq.params {
		if !createOnlyParams[k] {
			params[k] = rq.str(k)
		}
	}
	// $check_storage_access and $check_drive_param, before the worker
	if err := s.checkStorageAccess(rq.authid, params, rq.str("import-working-storage")); err != nil {
		return nil, err
	}
	if err := checkDriveParams(params); err != nil {
		return nil, err
	}
	allocs := allocDrives(params)
	diskN := 0
	for k := range rq.params {
		if createOnlyParams[k] {
			continue
		}
		val := rq.str(k)
		if _, ok := allocs[k]; ok {
			continue // create_disks allocates it in the worker
		}
		if reDiskKey.MatchString(k) {
			if m := reNewDisk.FindStringSubmatch(val); m != nil && k == "efidisk0" {
				// create_disks' create_efidisk: the vars image's size
				// whatever SIZE says (qemualloc.go)
				val = fmt.Sprintf("%s:vm-%d-disk-%d%s,size=%s", m[1], vmid, diskN, m[3], sizeText(efiVarsSize(m[3])))
				diskN++
			} else if m != nil {
				val = fmt.Sprintf("%s:vm-%d-disk-%d,size=%sG%s", m[1], vmid, diskN, m[2], m[3])
				diskN++
			}
		}
		if strings.HasPrefix(k, "net") {
			if mac, _ := parseNet(val); mac == "" {
				val = setNetMAC(val, randomMAC())
			}
		}
		conf[k] = val
	}
	if _, ok := conf["smbios1"]; !ok {
		conf["smbios1"] = "uuid=" + uuidish()
	}
	if _, ok := conf["vmgenid"]; !ok {
		conf["vmgenid"] = uuidish()
	}
	// create_vm: "always pin Windows' machine version on create"
	if m, ok := pinWindowsMachine(conf["machine"], conf["ostype"]); ok {
		conf["machine"] = m
	}
	s.mu.Lock()
	if pool != "" && s.pools[pool] == nil {
		s.mu.Unlock()
		return nil, permFail(fmt.Sprintf("pool '%s' does not exist", pool))
	}
	if err := s.vmidUnusedLocked(vmid); err != nil {
		s.mu.Unlock()
		return nil, fail("unable to create VM %d - %v", vmid, err)
	}
	conf["lock"] = "create"
	v := &vm{vmid: vmid, node: rq.str("node"), conf: conf, snaps: map[string]*snapshot{}}
	s.vms[vmid] = v
	node := s.vmNodeLocked(v)
	s.mu.Unlock()
	// qemu-server create_vm runs the worker's $realcmd (create_disks, the
	// import, the config write) inside lock_config_full($vmid, 1, ...):
	// the VM's config flock is held for the whole import, so a destroy,
	// even with skiplock, waits for it (lock_config: 10 s). Taken here,
	// before the task starts, so no destroy comes between the answer and
	// the worker's flock.
	unlock, err := s.guestLock(ctx, kindQemu, node, vmid, time.Second)
	if err != nil {
		s.mu.Lock()
		delete(s.vms, vmid)
		s.mu.Unlock()
		return nil, err
	}
	start := rq.bool("start", false)
	confNow := copyConf(conf)
	return s.startTask(rq, "qmcreate", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		if err := s.createLocked(ctx, t, vmid, allocs, confNow, pool, unlock); err != nil {
			return err
		}
		if start {
			return s.doStart(ctx, t, vmid, false)
		}
		return nil
	}), nil
}

// createLocked is the create worker under the VM's config lock, which it
// releases (unlock) before it returns: the disks created (imported) and
// the config completed, or the VM removed on failure.
func (s *Server) createLocked(ctx context.Context, t *task, vmid int, allocs, confNow map[string]string, pool string, unlock func()) error {
	defer unlock()
	created, err := s.createDisks(ctx, vmid, t.pid, allocs, confNow, t.logf)
	if err == nil {
		err = os.MkdirAll(s.DiskDir(vmid), 0o755)
	}
	if err != nil {
		s.mu.Lock()
		delete(s.vms, vmid)
		s.mu.Unlock()
		_ = os.RemoveAll(s.vmDir(vmid))
		return fmt.Errorf("unable to create VM %d - %v", vmid, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.vms[vmid]
	if v == nil {
		return fmt.Errorf("unable to create VM %d - its config is gone", vmid)
	}
	for k, val := range created {
		v.conf[k] = val
	}
	delete(v.conf, "lock")
	if pool != "" && s.pools[pool] != nil {
		v.pool = pool
		s.pools[pool].vms[vmid] = true
	}
	return nil
}

func (s *Server) deleteVM(ctx context.Context, rq *request) (any, error) {
	vmid := s.vmid(rq)
	skiplock := rq.bool("skiplock", false)
	purge := rq.bool("purge", false)
	// destroy_vm's early checks (config exists, not running) run before the
	// worker; the lock is checked inside it (PVE::QemuServer::destroy_vm).
	err := s.openVM(rq, checkSkiplock, func(v *vm) error {
		if v.running {
			return fail("VM %d is running - destroy failed", vmid)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s.startTask(rq, "qmdestroy", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		v, unlock, err := s.lockVM(ctx, vmid, func(v *vm) error {
			if !skiplock {
				if err := checkLock(v); err != nil {
					return err
				}
			}
			if v.running {
				return fail("VM %d is running - destroy failed", vmid)
			}
			v.conf["lock"] = "destroyed"
			return nil
		})
		if err != nil {
			return err
		}
		defer unlock()
		if err := os.RemoveAll(s.vmDir(vmid)); err != nil {
			return fmt.Errorf("remove disks: %w", err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.freeOwnedImagesLocked(t, v)
		if v.pool != "" && s.pools[v.pool] != nil {
			delete(s.pools[v.pool].vms, vmid)
		}
		_ = s.ipamNICsLocked(vmid, v.conf, nil) // removals only: cannot fail
		if purge {
			s.removeVMACLsLocked(vmid)
		}
		delete(s.vms, vmid)
		t.logf("purging VM %d from related configurations..", vmid)
		return nil
	}), nil
}

func (s *Server) templateVM(ctx context.Context, rq *request) (any, error) {
	vmid := s.vmid(rq)
	err := s.openVM(rq, nil, func(v *vm) error {
		if err := checkLock(v); err != nil {
			return err
		}
		if v.conf["template"] == "1" {
			return fail("you can't convert a template to a template")
		}
		if v.running {
			return fail("you can't convert a VM to template if VM is running")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s.startTask(rq, "qmtemplate", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		v, err := s.loadVM(vmid)
		if err != nil {
			return err
		}
		if v.running {
			return fail("you can't convert a VM to template if VM is running")
		}
		for k, val := range v.conf {
			if reDiskKey.MatchString(k) {
				if m := reVolume.FindStringSubmatch(val); m != nil {
					v.conf[k] = fmt.Sprintf("%s:base-%d-%s%s", m[1], vmid, m[3], m[4])
				}
			}
		}
		v.conf["template"] = "1"
		return nil
	}), nil
}
