package pveemu

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// updateOnlyParams are config update parameters that are not config keys.
var updateOnlyParams = map[string]bool{
	"node": true, "vmid": true, "delete": true, "revert": true, "digest": true, "skiplock": true, "force": true, "background_delay": true,
	"import-working-storage": true,
}

func (s *Server) getConfig(_ context.Context, rq *request) (any, error) {
	var out map[string]any
	err := s.openVM(rq, nil, func(v *vm) error {
		conf := v.conf
		sn := rq.str("snapshot")
		if sn != "" {
			snap := v.snaps[sn]
			if snap == nil {
				return fail("snapshot '%s' does not exist", sn)
			}
			conf = snap.conf
		}
		if sn == "" && !rq.bool("current", false) {
			conf = withPending(v)
		}
		out = map[string]any{"digest": confDigest(conf)}
		for k, val := range conf {
			out[k] = configValue(k, val)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// getPending is GET .../pending (qemu-server vm_pending).
func (s *Server) getPending(_ context.Context, rq *request) (any, error) {
	var out []map[string]any
	err := s.openVM(rq, nil, func(v *vm) error {
		out = pendingArray(v)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// configValue renders the config keys whose schema type is integer or
// boolean as numbers: qemu-server's parse_vm_config passes every value
// through check_type, which returns int() for those types; memory is a
// property string (`[current=]<MiB>`, type string in the schema), so it
// stays a string.
func configValue(k, v string) any {
	switch k {
	case "cores", "sockets", "balloon", "template", "onboot", "vcpus", "cpuunits", "shares", "acpi", "kvm", "tablet", "protection":
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return v
}

// configUpdate is one config update (PUT or POST .../config): what
// update_vm reads from its parameters.
type configUpdate struct {
	vmid     int
	changes  map[string]string
	deletes  []string
	reverts  []string
	skiplock bool
	force    bool
	digest   string
	authid   string
	// workingStorage is import-working-storage (an OVA's extraction).
	workingStorage string
	// pid and logf are the task's, for create_disks' log lines (nil logf
	// for the synchronous update).
	pid  uint32
	logf func(format string, a ...any)
}

// parse reads the changes and deletions of rq and refuses what update_vm
// refuses before it loads the config.
func (u *configUpdate) parse(rq *request) error {
	if err := checkSkiplock(rq); err != nil {
		return err
	}
	u.changes = map[string]string{}
	for k := range rq.params {
		if !updateOnlyParams[k] {
			u.changes[k] = rq.str(k)
		}
	}
	if t, ok := u.changes["tags"]; ok {
		u.changes["tags"] = uniqueTags(t)
	}
	u.deletes = splitList(rq.str("delete"))
	u.reverts = splitList(rq.str("revert"))
	if len(u.changes) == 0 && len(u.deletes) == 0 && len(u.reverts) == 0 {
		return fail("no options specified")
	}
	for _, r := range u.reverts {
		if _, ok := u.changes[r]; ok {
			// update_vm_api's message, its odd parameter name included
			return paramFail(ParamErrors{"delete": fmt.Sprintf("you can't use '-%s' and -revert %s' at the same time", r, r)})
		}
	}
	for _, d := range u.deletes {
		if _, ok := u.changes[d]; ok {
			return paramFail(ParamErrors{"delete": fmt.Sprintf("cannot set and delete '%s' at the same time", d)})
		}
		if slices.Contains(u.reverts, d) {
			return paramFail(ParamErrors{"revert": fmt.Sprintf("you can't use '-delete %s' and -revert %s' at the same time", d, d)})
		}
	}
	return nil
}

// revertLocked turns u's reverts into changes and deletions the way
// update_vm's load_and_check_config does: a key in the config is set to
// its current value (its pending value or deletion dropped), a key only
// pending is deleted (a disk's volume then becomes unusedN).
func (u *configUpdate) revertLocked(v *vm) {
	for _, k := range u.reverts {
		if cur, ok := v.conf[k]; ok {
			u.changes[k] = cur
		} else if _, ok := v.pending[k]; ok {
			u.deletes = append(u.deletes, k)
		}
	}
}

func (s *Server) updateConfig(ctx context.Context, rq *request, async bool) (any, error) {
	u := &configUpdate{vmid: s.vmid(rq), skiplock: rq.bool("skiplock", false), force: rq.bool("force", false),
		digest: rq.str("digest"), authid: rq.authid, workingStorage: rq.str("import-working-storage")}
	onVM := vmExists
	if !async {
		onVM = nil // the synchronous update loads the config under its lock only
	}
	// update_vm_api checks the request's privileges before it loads the
	// config and before the asynchronous update forks its worker: a
	// refusal is the request's 403, not the task's.
	parse := func(rq *request) error {
		if err := u.parse(rq); err != nil {
			return err
		}
		// $check_drive_param, the keys' privileges, $check_storage_access
		if err := checkDriveParams(u.changes); err != nil {
			return err
		}
		s.mu.Lock()
		err := s.checkUpdateRequestLocked(u)
		s.mu.Unlock()
		if err != nil {
			return err
		}
		return s.checkStorageAccess(u.authid, u.changes, u.workingStorage)
	}
	if err := s.openVM(rq, parse, onVM); err != nil {
		return nil, err
	}
	if !async {
		return nil, s.applyConfig(ctx, u)
	}
	return s.startTask(rq, "qmconfig", strconv.Itoa(u.vmid), func(ctx context.Context, t *task) error {
		u.pid, u.logf = t.pid, t.logf
		return s.applyConfig(ctx, u)
	}), nil
}

// applyConfig applies u under the VM's config lock. Drives that allocate
// (allocDrives: a cloud-init drive, an import) are created first, under
// the config lock but not s.mu, after the checks that need the config
// (update_vm_api calls create_disks inside its loop over the keys, after
// the digest, lock and per-key privilege checks); the update then applies
// their new values, and frees them when it fails.
func (s *Server) applyConfig(ctx context.Context, u *configUpdate) error {
	allocs := allocDrives(u.changes)
	if len(allocs) == 0 {
		_, unlock, err := s.lockVM(ctx, u.vmid, func(v *vm) error { return s.applyConfigLocked(ctx, u, v) })
		if err != nil {
			return err
		}
		unlock()
		return nil
	}
	var conf map[string]string
	_, unlock, err := s.lockVM(ctx, u.vmid, func(v *vm) error {
		if err := s.precheckUpdateLocked(u, v); err != nil {
			return err
		}
		conf = withPending(v)
		return nil
	})
	if err != nil {
		return err
	}
	defer unlock()
	created, err := s.createDisks(ctx, u.vmid, u.pid, allocs, conf, u.logf)
	if err != nil {
		return err
	}
	for k, val := range created {
		u.changes[k] = val
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.loadVM(u.vmid)
	if err == nil {
		err = s.applyCheckedLocked(ctx, u, v)
	}
	if err != nil {
		s.freeCreatedLocked(u.vmid, created)
	}
	return err
}

// precheckUpdateLocked is what update_vm_api checks with the config loaded
// before it changes anything: digest, lock, root-only keys, then (the
// reverted keys turned into changes and deletions) the keys' privileges
// by value. The request's own checks ran before the fork
// (checkUpdateRequestLocked).
func (s *Server) precheckUpdateLocked(u *configUpdate, v *vm) error {
	if u.digest != "" && u.digest != confDigest(v.conf) {
		return fail("detected modified configuration - file changed by other user? Try again.")
	}
	if !u.skiplock {
		if err := checkLock(v); err != nil {
			return err
		}
	}
	if err := checkRootOnlyConfig(u.authid, u.changes, u.deletes, v.conf); err != nil {
		return err
	}
	u.revertLocked(v)
	return s.checkConfigValuePermsLocked(u.authid, u.vmid, u.changes, u.deletes, v.conf, v.pending)
}

// freeCreatedLocked frees the volumes of created (drive values by key)
// after a failed update.
func (s *Server) freeCreatedLocked(vmid int, created map[string]string) {
	dc := &diskCreator{s: s, vmid: vmid, taken: map[string]bool{}}
	for _, val := range created {
		dc.freeVolume(parseDrive(val).file)
	}
}

// applyConfigLocked checks u against v's config and applies it.
func (s *Server) applyConfigLocked(ctx context.Context, u *configUpdate, v *vm) error {
	if err := s.precheckUpdateLocked(u, v); err != nil {
		return err
	}
	return s.applyCheckedLocked(ctx, u, v)
}

// applyCheckedLocked applies u, checked by precheckUpdateLocked, to v.
// New disks given as STORAGE:SIZE are allocated first (allocNewDisksLocked;
// imports and cloud-init drives were created by applyConfig).
func (s *Server) applyCheckedLocked(ctx context.Context, u *configUpdate, v *vm) error {
	if err := s.allocNewDisksLocked(v, u.changes); err != nil {
		return err
	}
	pinOnOSTypeLocked(v, u.changes, u.deletes)
	old := copyConf(v.conf)
	changes, deletes := dropPendingLocked(v, u.changes, u.deletes)
	changes, deletes = deferDisks(v, changes, deletes, u.force)
	// vmconfig_hotplug_pending: what cannot be hot-plugged stays pending
	// and the update fails with one "hotplug problem" per key, after the
	// rest is applied.
	failed, err := s.hotplugDisks(ctx, u, v, changes, deletes)
	if err != nil {
		return err
	}
	dropFromBootOrder(v.conf, u.changes, u.deletes)
	for _, d := range deletes {
		if _, ok := failed[d]; !ok {
			delete(v.conf, d)
		}
	}
	for k, val := range changes {
		if _, ok := failed[k]; ok {
			continue
		}
		if strings.HasPrefix(k, "net") {
			if mac, _ := parseNet(val); mac == "" {
				val = setNetMAC(val, randomMAC())
			}
		}
		v.conf[k] = val
	}
	if err := s.ipamNICsLocked(u.vmid, old, v.conf); err != nil {
		return err
	}
	if len(failed) > 0 {
		return paramFail(failed)
	}
	return nil
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
	vmid := s.vmid(rq)
	disk, size := rq.str("disk"), rq.str("size")
	grow := strings.HasPrefix(size, "+")
	var want int64
	params := func(*request) error {
		m := regexp.MustCompile(`^\+?(\d+(?:\.\d+)?)([KMGT]?)$`).FindStringSubmatch(size)
		if m == nil {
			return fail("unable to parse size '%s'", size) // the schema's pattern refused it already
		}
		var err error
		if want, err = sizeBytes(m[1], m[2]); err != nil {
			return fail("unable to parse size '%s'", size)
		}
		return nil
	}
	err := s.openVM(rq, params, func(v *vm) error {
		if err := checkLock(v); err != nil {
			return err
		}
		var cur int64
		val, ok := v.conf[disk]
		if !ok || !reDiskKey.MatchString(disk) {
			return fail("disk '%s' does not exist", disk)
		} else if sm := reSizeOpt.FindStringSubmatch(val); sm != nil {
			cur, _ = sizeBytes(sm[2], sm[3])
		}
		if grow {
			want += cur
		}
		if want < cur {
			return fail("shrinking disks is not supported")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s.startTask(rq, "resize", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
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

// dropFromBootOrder takes each deleted key out of the config's boot order
// (boot "order=scsi0;net0"): update_vm_api's "remove from bootorder if
// necessary" (qemu-server API2/Qemu.pm), which reads the order once
// (PVE::Tools::split_list of the pve-qm-boot order) and writes what is
// left with print_bootorder (none when nothing is). A boot value given in the
// same request is set after the deletions and wins; the emulator applies
// the new order at once (qemu-server writes it pending, applied with the
// rest of a stopped VM's pending values).
func dropFromBootOrder(conf, changes map[string]string, deletes []string) {
	if _, ok := changes["boot"]; ok || conf["boot"] == "" {
		return
	}
	var order []string
	found := false
	for _, kv := range strings.Split(conf["boot"], ",") {
		if k, val, ok := strings.Cut(kv, "="); ok && k == "order" {
			order, found = splitList(val), true
		}
	}
	if !found {
		return
	}
	kept := slices.DeleteFunc(slices.Clone(order), func(d string) bool { return slices.Contains(deletes, d) })
	if len(kept) == len(order) {
		return
	}
	if len(kept) == 0 {
		// print_bootorder's "": written as "boot: ", a line
		// parse_vm_config's "key: value" pattern (.+) does not read back
		delete(conf, "boot")
		return
	}
	conf["boot"] = "order=" + strings.Join(kept, ";")
}
