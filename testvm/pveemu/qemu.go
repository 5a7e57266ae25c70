package pveemu

import (
	"context"
	"crypto/sha1"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

type vm struct {
	vmid    int
	conf    map[string]string
	running bool
	started time.Time
	pool    string
	snaps   map[string]*snapshot
}

type snapshot struct {
	name        string
	description string
	snaptime    int64
	parent      string
	conf        map[string]string
}

// createOnlyParams are create/clone parameters that are not config keys.
var createOnlyParams = map[string]bool{
	"node": true, "vmid": true, "pool": true, "start": true, "storage": true, "archive": true,
	"force": true, "unique": true, "live-restore": true, "bwlimit": true, "import-working-storage": true, "ha-managed": true,
}

// updateOnlyParams are config update parameters that are not config keys.
var updateOnlyParams = map[string]bool{
	"node": true, "vmid": true, "delete": true, "revert": true, "digest": true, "skiplock": true, "force": true, "background_delay": true,
}

var (
	reDiskKey  = regexp.MustCompile(`^(ide|sata|scsi|virtio|efidisk|tpmstate)\d+$`)
	reNewDisk  = regexp.MustCompile(`^([a-zA-Z][a-zA-Z0-9\-_.]*[a-zA-Z0-9]):(\d+(?:\.\d+)?)(,.*)?$`)
	reVolume   = regexp.MustCompile(`^([^:]+):(?:base-\d+-disk-\d+/)?(?:vm|base)-(\d+)-(disk-\d+)(.*)$`)
	reNetModel = regexp.MustCompile(`^([a-z0-9_-]+)(?:=([0-9A-Fa-f:]{17}))?$`)
	reNetKey   = regexp.MustCompile(`^net\d+$`)
)

func (s *Server) cfsPath(vmid int) string {
	return fmt.Sprintf("nodes/%s/qemu-server/%d.conf", s.node, vmid)
}

// vmDir is the per-VM state directory; its "disk" subdirectory is the
// guest's disk and "snap-<name>" hold snapshot copies.
func (s *Server) vmDir(vmid int) string {
	return filepath.Join(s.dataDir, "images", strconv.Itoa(vmid))
}

// DiskDir is the disk directory of a VM.
func (s *Server) DiskDir(vmid int) string { return filepath.Join(s.vmDir(vmid), "disk") }

func (s *Server) loadVM(vmid int) (*vm, error) {
	v := s.vms[vmid]
	if v == nil {
		return nil, fail("Configuration file '%s' does not exist", s.cfsPath(vmid))
	}
	return v, nil
}

func checkLock(v *vm) error {
	if l := v.conf["lock"]; l != "" {
		return fail("VM is locked (%s)", l)
	}
	return nil
}

// vmLock is the per-VM config lock (flock on lock-<vmid>.conf on a node).
func (s *Server) vmLock(ctx context.Context, vmid int, timeout time.Duration) (func(), error) {
	s.mu.Lock()
	m := s.vmLocks[vmid]
	if m == nil {
		m = &sync.Mutex{}
		s.vmLocks[vmid] = m
	}
	s.mu.Unlock()
	deadline := time.Now().Add(timeout)
	for !m.TryLock() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fail("can't lock file '/var/lock/qemu-server/lock-%d.conf' - got timeout", vmid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return m.Unlock, nil
}

func (s *Server) checkNode(rq *request) error {
	if n := rq.str("node"); n != "" && n != s.node {
		return fail("hostname lookup '%s' failed - failed to get address info for: %s: Name or service not known", n, n)
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
// and template=1 are set unless given.
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
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, id := range sortedVMIDs(s.vms) {
		if !s.privilegesLocked(rq.authid, fmt.Sprintf("/vms/%d", id))["VM.Audit"] {
			continue
		}
		out = append(out, s.vmStatusLocked(s.vms[id]))
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

func (s *Server) vmStatusLocked(v *vm) map[string]any {
	st := map[string]any{
		"vmid": v.vmid, "status": "stopped", "qmpstatus": "stopped", "name": v.conf["name"],
		"cpus": atoiDef(v.conf["cores"], 1), "maxmem": atoiDef(v.conf["memory"], 512) * 1024 * 1024,
		"maxdisk": 8 << 30, "uptime": 0, "mem": 0, "cpu": 0, "disk": 0, "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0,
	}
	if v.running {
		st["status"], st["qmpstatus"] = "running", "running"
		st["uptime"] = int(time.Since(v.started).Seconds())
		st["pid"] = 100000 + v.vmid
	}
	if v.conf["template"] == "1" {
		st["template"] = 1
	}
	if l := v.conf["lock"]; l != "" {
		st["lock"] = l
	}
	if agentEnabled(v.conf["agent"]) {
		st["agent"] = 1
	}
	if t := v.conf["tags"]; t != "" {
		st["tags"] = t
	}
	return st
}

func atoiDef(s string, def int) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return def
	}
	return n
}

func agentEnabled(v string) bool {
	if v == "" {
		return false
	}
	first, _, _ := strings.Cut(v, ",")
	if k, val, ok := strings.Cut(first, "="); ok {
		if k != "enabled" {
			return false
		}
		first = val
	}
	return parseBoolText(first) == "1"
}

func (s *Server) vmIndex(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.loadVM(s.vmid(rq)); err != nil {
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
	diskN := 0
	for k := range rq.params {
		if createOnlyParams[k] {
			continue
		}
		val := rq.str(k)
		if reDiskKey.MatchString(k) {
			if m := reNewDisk.FindStringSubmatch(val); m != nil {
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
	s.mu.Lock()
	if pool != "" && s.pools[pool] == nil {
		s.mu.Unlock()
		return nil, permFail(fmt.Sprintf("pool '%s' does not exist", pool))
	}
	if _, ok := s.vms[vmid]; ok {
		s.mu.Unlock()
		return nil, fail("unable to create VM %d - VM %d already exists on node '%s'", vmid, vmid, s.node)
	}
	conf["lock"] = "create"
	s.vms[vmid] = &vm{vmid: vmid, conf: conf, snaps: map[string]*snapshot{}}
	s.mu.Unlock()
	start := rq.bool("start", false)
	return s.startTask(rq.authid, "qmcreate", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		if err := os.MkdirAll(s.DiskDir(vmid), 0o755); err != nil {
			s.mu.Lock()
			delete(s.vms, vmid)
			s.mu.Unlock()
			return fmt.Errorf("unable to create VM %d - %v", vmid, err)
		}
		s.mu.Lock()
		v := s.vms[vmid]
		delete(v.conf, "lock")
		if pool != "" && s.pools[pool] != nil {
			v.pool = pool
			s.pools[pool].vms[vmid] = true
		}
		s.mu.Unlock()
		if start {
			return s.doStart(ctx, t, vmid, false)
		}
		return nil
	}), nil
}

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

func (s *Server) getConfig(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.loadVM(s.vmid(rq))
	if err != nil {
		return nil, err
	}
	conf := v.conf
	if sn := rq.str("snapshot"); sn != "" {
		snap := v.snaps[sn]
		if snap == nil {
			return nil, fail("snapshot '%s' does not exist", sn)
		}
		conf = snap.conf
	}
	out := map[string]any{"digest": confDigest(conf)}
	for k, val := range conf {
		out[k] = configValue(k, val)
	}
	return out, nil
}

// configValue renders numeric config keys as numbers like PVE does.
func configValue(k, v string) any {
	switch k {
	case "memory", "cores", "sockets", "balloon", "template", "onboot", "vcpus", "cpuunits", "shares", "acpi", "kvm", "tablet", "protection":
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return v
}

func (s *Server) updateConfig(ctx context.Context, rq *request, async bool) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid := s.vmid(rq)
	skiplock := rq.bool("skiplock", false)
	if skiplock && rq.authid != "root@pam" {
		return nil, paramFail(ParamErrors{"skiplock": "Only root may use this option."})
	}
	changes := map[string]string{}
	for k := range rq.params {
		if !updateOnlyParams[k] {
			changes[k] = rq.str(k)
		}
	}
	if t, ok := changes["tags"]; ok {
		changes["tags"] = uniqueTags(t)
	}
	deletes := splitList(rq.str("delete"))
	for _, d := range deletes {
		if _, ok := changes[d]; ok {
			return nil, paramFail(ParamErrors{"delete": fmt.Sprintf("cannot set and delete '%s' at the same time", d)})
		}
	}
	if len(changes) == 0 && len(deletes) == 0 && !rq.has("revert") {
		return nil, fail("no options specified")
	}
	digest := rq.str("digest")
	authid := rq.authid
	force := rq.bool("force", false)
	apply := func(ctx context.Context) error {
		unlock, err := s.vmLock(ctx, vmid, 10*time.Second)
		if err != nil {
			return err
		}
		defer unlock()
		s.mu.Lock()
		defer s.mu.Unlock()
		v, err := s.loadVM(vmid)
		if err != nil {
			return err
		}
		if digest != "" && digest != confDigest(v.conf) {
			return fail("detected modified configuration - file changed by other user? Try again.")
		}
		if !skiplock {
			if err := checkLock(v); err != nil {
				return err
			}
		}
		if err := checkRootOnlyConfig(authid, changes, deletes, v.conf); err != nil {
			return err
		}
		old := copyConf(v.conf)
		if err := s.hotplugDisks(ctx, v, changes, deletes, force); err != nil {
			return err
		}
		for _, d := range deletes {
			delete(v.conf, d)
		}
		for k, val := range changes {
			if strings.HasPrefix(k, "net") {
				if mac, _ := parseNet(val); mac == "" {
					val = setNetMAC(val, randomMAC())
				}
			}
			v.conf[k] = val
		}
		return s.ipamNICsLocked(vmid, old, v.conf)
	}
	if !async {
		return nil, apply(ctx)
	}
	s.mu.Lock()
	_, err := s.loadVM(vmid)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.startTask(rq.authid, "qmconfig", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		return apply(ctx)
	}), nil
}

func (s *Server) statusCurrent(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.loadVM(s.vmid(rq))
	if err != nil {
		return nil, err
	}
	st := s.vmStatusLocked(v)
	st["ha"] = map[string]any{"managed": 0}
	return st, nil
}

// vmSpec derives what the backend needs to start the guest.
func (s *Server) vmSpecLocked(v *vm) (VMSpec, error) {
	spec := VMSpec{VMID: v.vmid, Disk: s.DiskDir(v.vmid)}
	if n := v.conf["net0"]; n != "" {
		mac, bridge := parseNet(n)
		spec.VNet = bridge
		if mac != "" {
			hw, err := net.ParseMAC(mac)
			if err != nil {
				return spec, fmt.Errorf("net0: %w", err)
			}
			spec.MAC = hw
		}
		if bridge != "" && !s.sdn.bridgeRunning(bridge) {
			return spec, fmt.Errorf("bridge '%s' does not exist", bridge)
		}
	}
	return spec, nil
}

func (s *Server) doStart(ctx context.Context, t *task, vmid int, skiplock bool) error {
	unlock, err := s.vmLock(ctx, vmid, 10*time.Second)
	if err != nil {
		return err
	}
	defer unlock()
	s.mu.Lock()
	v, err := s.loadVM(vmid)
	if err == nil && v.conf["template"] == "1" {
		err = fail("you can't start a vm if it's a template")
	}
	if err == nil && !skiplock {
		err = checkLock(v)
	}
	if err == nil && v.running {
		err = fail("VM %d already running", vmid)
	}
	var spec VMSpec
	if err == nil {
		spec, err = s.vmSpecLocked(v)
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if err := s.backend.StartVM(ctx, spec); err != nil {
		return fmt.Errorf("start failed: %w", err)
	}
	s.mu.Lock()
	if v := s.vms[vmid]; v != nil {
		v.running, v.started = true, time.Now()
	}
	s.mu.Unlock()
	return nil
}

func (s *Server) doStop(ctx context.Context, vmid int, skiplock bool) error {
	unlock, err := s.vmLock(ctx, vmid, 10*time.Second)
	if err != nil {
		return err
	}
	defer unlock()
	s.mu.Lock()
	v, err := s.loadVM(vmid)
	if err == nil && !skiplock {
		err = checkLock(v)
	}
	running := err == nil && v.running
	s.mu.Unlock()
	if err != nil || !running {
		return err
	}
	if err := s.backend.StopVM(ctx, vmid); err != nil {
		return fmt.Errorf("stop failed: %w", err)
	}
	s.mu.Lock()
	if v := s.vms[vmid]; v != nil {
		v.running = false
	}
	s.mu.Unlock()
	return nil
}

func (s *Server) vmAction(typ string) handlerFunc {
	return func(ctx context.Context, rq *request) (any, error) {
		if err := s.checkNode(rq); err != nil {
			return nil, err
		}
		vmid := s.vmid(rq)
		skiplock := rq.bool("skiplock", false)
		if skiplock && rq.authid != "root@pam" {
			return nil, paramFail(ParamErrors{"skiplock": "Only root may use this option."})
		}
		s.mu.Lock()
		v, err := s.loadVM(vmid)
		running := v != nil && v.running
		s.mu.Unlock()
		if err != nil && typ != "qmstop" {
			return nil, err
		}
		switch typ {
		case "qmstart":
			return s.startTask(rq.authid, typ, strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
				return s.doStart(ctx, t, vmid, skiplock)
			}), nil
		case "qmstop":
			// vm_stop forks the worker at once: PVE::QemuServer::vm_stop
			// loads the config (a missing VM fails the task) and returns
			// quietly when the VM is not running (task OK).
			return s.startTask(rq.authid, typ, strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
				return s.doStop(ctx, vmid, skiplock)
			}), nil
		default: // qmshutdown
			if err != nil {
				return nil, err
			}
			if !running {
				return nil, fail("VM %d not running", vmid)
			}
			return s.startTask(rq.authid, typ, strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
				return s.doStop(ctx, vmid, skiplock)
			}), nil
		}
	}
}

func (s *Server) deleteVM(ctx context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid := s.vmid(rq)
	skiplock := rq.bool("skiplock", false)
	if skiplock && rq.authid != "root@pam" {
		return nil, paramFail(ParamErrors{"skiplock": "Only root may use this option."})
	}
	purge := rq.bool("purge", false)
	// destroy_vm's early checks (config exists, not running) run before the
	// worker; the lock is checked inside it (PVE::QemuServer::destroy_vm).
	s.mu.Lock()
	v, err := s.loadVM(vmid)
	if err == nil && v.running {
		err = fail("VM %d is running - destroy failed", vmid)
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.startTask(rq.authid, "qmdestroy", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		unlock, err := s.vmLock(ctx, vmid, 10*time.Second)
		if err != nil {
			return err
		}
		defer unlock()
		s.mu.Lock()
		v, err := s.loadVM(vmid)
		if err == nil && !skiplock {
			err = checkLock(v)
		}
		if err == nil && v.running {
			err = fail("VM %d is running - destroy failed", vmid)
		}
		if err == nil {
			v.conf["lock"] = "destroyed"
		}
		s.mu.Unlock()
		if err != nil {
			return err
		}
		if err := os.RemoveAll(s.vmDir(vmid)); err != nil {
			return fmt.Errorf("remove disks: %w", err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if v.pool != "" && s.pools[v.pool] != nil {
			delete(s.pools[v.pool].vms, vmid)
		}
		_ = s.ipamNICsLocked(vmid, v.conf, nil) // removals only: cannot fail
		if purge {
			path := fmt.Sprintf("/vms/%d", vmid)
			kept := s.acl[:0]
			for _, e := range s.acl {
				if e.path != path {
					kept = append(kept, e)
				}
			}
			s.acl = kept
		}
		delete(s.vms, vmid)
		t.logf("purging VM %d from related configurations..", vmid)
		return nil
	}), nil
}

func (s *Server) templateVM(ctx context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid := s.vmid(rq)
	s.mu.Lock()
	v, err := s.loadVM(vmid)
	if err == nil {
		err = checkLock(v)
	}
	if err == nil && v.conf["template"] == "1" {
		err = fail("you can't convert a template to a template")
	}
	if err == nil && v.running {
		err = fail("you can't convert a VM to template if VM is running")
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.startTask(rq.authid, "qmtemplate", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
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

// ---- snapshots ----

func (s *Server) listSnapshots(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.loadVM(s.vmid(rq))
	if err != nil {
		return nil, err
	}
	out := []map[string]any{}
	for _, n := range sortedKeys(v.snaps) {
		sn := v.snaps[n]
		e := map[string]any{"name": sn.name, "description": sn.description, "snaptime": sn.snaptime}
		if sn.parent != "" {
			e["parent"] = sn.parent
		}
		out = append(out, e)
	}
	cur := map[string]any{"name": "current", "digest": confDigest(v.conf), "description": "You are here!", "running": boolInt(v.running)}
	if p := v.conf["parent"]; p != "" {
		cur["parent"] = p
	}
	return append(out, cur), nil
}

func (s *Server) createSnapshot(ctx context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid, name, desc := s.vmid(rq), rq.str("snapname"), rq.str("description")
	if name == "current" {
		return nil, fail("invalid snapshot name 'current'")
	}
	if rq.bool("vmstate", false) {
		return nil, fail("snapshot feature is not available")
	}
	s.mu.Lock()
	_, err := s.loadVM(vmid)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.startTask(rq.authid, "qmsnapshot", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		unlock, err := s.vmLock(ctx, vmid, 10*time.Second)
		if err != nil {
			return err
		}
		s.mu.Lock()
		v, err := s.loadVM(vmid)
		if err == nil {
			err = checkLock(v)
		}
		if err == nil && v.conf["template"] == "1" {
			err = fail("you can't take a snapshot if it's a template")
		}
		if err == nil && v.snaps[name] != nil {
			err = fail("snapshot name '%s' already used", name)
		}
		if err == nil {
			v.conf["lock"] = "snapshot"
		}
		s.mu.Unlock()
		unlock()
		if err != nil {
			return err
		}
		dst := filepath.Join(s.vmDir(vmid), "snap-"+name)
		cerr := copyDir(ctx, s.DiskDir(vmid), dst)
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(v.conf, "lock")
		if cerr != nil {
			_ = os.RemoveAll(dst)
			return fmt.Errorf("snapshot '%s': %w", name, cerr)
		}
		snapConf := copyConf(v.conf)
		delete(snapConf, "parent")
		v.snaps[name] = &snapshot{name: name, description: desc, snaptime: time.Now().Unix(), parent: v.conf["parent"], conf: snapConf}
		v.conf["parent"] = name
		return nil
	}), nil
}

func (s *Server) rollbackSnapshot(ctx context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid, name := s.vmid(rq), rq.str("snapname")
	start := rq.bool("start", false)
	// The start runs inside the worker, so the API checks VM.PowerMgmt up
	// front (qemu-server API2/Qemu.pm rollback).
	if start {
		if err := s.checkPrivs(rq.authid, fmt.Sprintf("/vms/%d", vmid), []string{"VM.PowerMgmt"}, false); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	v, err := s.loadVM(vmid)
	if err == nil && v.snaps[name] == nil {
		err = fail("snapshot '%s' does not exist", name)
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.startTask(rq.authid, "qmrollback", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		s.mu.Lock()
		v, err := s.loadVM(vmid)
		if err == nil && v.conf["template"] == "1" {
			err = fail("you can't rollback if vm is a template")
		}
		if err == nil && v.snaps[name] == nil {
			err = fail("snapshot '%s' does not exist", name)
		}
		if err == nil {
			err = checkLock(v)
		}
		wasRunning := err == nil && v.running
		s.mu.Unlock()
		if err != nil {
			return err
		}
		if wasRunning {
			if err := s.doStop(ctx, vmid, false); err != nil {
				return err
			}
		}
		s.mu.Lock()
		v.conf["lock"] = "rollback"
		s.mu.Unlock()
		disk := s.DiskDir(vmid)
		rerr := os.RemoveAll(disk)
		if rerr == nil {
			rerr = copyDir(ctx, filepath.Join(s.vmDir(vmid), "snap-"+name), disk)
		}
		s.mu.Lock()
		if rerr != nil {
			s.mu.Unlock()
			return fmt.Errorf("rollback failed: %w", rerr)
		}
		conf := copyConf(v.snaps[name].conf)
		conf["parent"] = name
		v.conf = conf
		s.mu.Unlock()
		if start {
			return s.doStart(ctx, t, vmid, false)
		}
		return nil
	}), nil
}

func (s *Server) deleteSnapshot(ctx context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid, name := s.vmid(rq), rq.str("snapname")
	force := rq.bool("force", false)
	s.mu.Lock()
	_, err := s.loadVM(vmid)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.startTask(rq.authid, "qmdelsnapshot", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		s.mu.Lock()
		v, err := s.loadVM(vmid)
		if err == nil && v.snaps[name] == nil {
			err = fail("snapshot '%s' does not exist", name)
		}
		if err == nil && !force {
			err = checkLock(v)
		}
		if err == nil {
			v.conf["lock"] = "snapshot-delete"
		}
		s.mu.Unlock()
		if err != nil {
			return err
		}
		rerr := os.RemoveAll(filepath.Join(s.vmDir(vmid), "snap-"+name))
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(v.conf, "lock")
		if rerr != nil {
			return fmt.Errorf("delete snapshot: %w", rerr)
		}
		parent := v.snaps[name].parent
		for _, other := range v.snaps {
			if other.parent == name {
				other.parent = parent
			}
		}
		if v.conf["parent"] == name {
			if parent != "" {
				v.conf["parent"] = parent
			} else {
				delete(v.conf, "parent")
			}
		}
		delete(v.snaps, name)
		return nil
	}), nil
}

var reSizeOpt = regexp.MustCompile(`(^|,)size=(\d+(?:\.\d+)?)([KMGT]?)`)

// sizeBytes converts a Proxmox size ("8G", "512M", "1024") to bytes.
func sizeBytes(num, unit string) (int64, error) {
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, err
	}
	mult := map[string]float64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit]
	return int64(f * mult), nil
}

// resizeVM grows a disk (PUT .../resize): a task, like Proxmox 8+; shrinking
// is refused as Proxmox refuses it.
func (s *Server) resizeVM(ctx context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid := s.vmid(rq)
	disk, size := rq.str("disk"), rq.str("size")
	grow := strings.HasPrefix(size, "+")
	m := regexp.MustCompile(`^\+?(\d+(?:\.\d+)?)([KMGT]?)$`).FindStringSubmatch(size)
	if m == nil {
		return nil, fail("unable to parse size '%s'", size) // the schema's pattern refused it already
	}
	want, err := sizeBytes(m[1], m[2])
	if err != nil {
		return nil, fail("unable to parse size '%s'", size)
	}
	s.mu.Lock()
	v, err := s.loadVM(vmid)
	if err == nil {
		err = checkLock(v)
	}
	var cur int64
	if err == nil {
		val, ok := v.conf[disk]
		if !ok || !reDiskKey.MatchString(disk) {
			err = fail("disk '%s' does not exist", disk)
		} else if sm := reSizeOpt.FindStringSubmatch(val); sm != nil {
			cur, _ = sizeBytes(sm[2], sm[3])
		}
	}
	if err == nil && grow {
		want += cur
	}
	if err == nil && want < cur {
		err = fail("shrinking disks is not supported")
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.startTask(rq.authid, "resize", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		v, err := s.loadVM(vmid)
		if err != nil {
			return err
		}
		// resize_vm checks the storage inside the worker's config lock.
		if sid := volumeStorage(v.conf[disk]); sid != "" {
			if err := s.checkPrivsLocked(rq.authid, "/storage/"+sid, []string{"Datastore.AllocateSpace"}); err != nil {
				return err
			}
		}
		gib := float64(want) / (1 << 30)
		nv := fmt.Sprintf("size=%sG", strconv.FormatFloat(gib, 'f', -1, 64))
		val := v.conf[disk]
		if reSizeOpt.MatchString(val) {
			val = reSizeOpt.ReplaceAllString(val, "${1}"+nv)
		} else {
			val += "," + nv
		}
		v.conf[disk] = val
		return nil
	}), nil
}

// volumeStorage is the storage ID of a disk value ("local-lvm:vm-1-disk-0,
// size=8G"); "" for none, CD-ROMs and values without a storage.
func volumeStorage(val string) string {
	if strings.Contains(val, "media=cdrom") {
		return ""
	}
	file, _, _ := strings.Cut(val, ",")
	if file == "none" || file == "cdrom" {
		return ""
	}
	sid, _, ok := strings.Cut(file, ":")
	if !ok {
		return ""
	}
	return sid
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

// uniqueTags normalises a tag list as a config update stores it
// (pve-guest-common PVE/GuestHelpers.pm get_unique_tags with the default
// tag style): split on ";", "," and spaces, lower-cased, sorted, without
// duplicates, joined with ";".
func uniqueTags(v string) string {
	var out []string
	for _, t := range strings.FieldsFunc(v, func(r rune) bool { return r == ';' || r == ',' || r == ' ' || r == '\t' || r == '\n' }) {
		out = append(out, strings.ToLower(t))
	}
	sort.Strings(out)
	return strings.Join(slices.Compact(out), ";")
}
