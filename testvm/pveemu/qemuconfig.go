package pveemu

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// updateOnlyParams are config update parameters that are not config keys.
var updateOnlyParams = map[string]bool{
	"node": true, "vmid": true, "delete": true, "revert": true, "digest": true, "skiplock": true, "force": true, "background_delay": true,
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
