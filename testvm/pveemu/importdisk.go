package pveemu

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The drives a VM create or config update allocates (qemu-server
// API2/Qemu.pm create_disks): "STORAGE:cloudinit" (a cloud-init drive)
// and "STORAGE:0,import-from=SOURCE" (a disk imported from a volume or,
// for root@pam, a file). Plain "STORAGE:SIZE" disks keep the emulator's
// older handling (createVM).
var (
	// reNewDiskFile is qemu-server Drive.pm $NEW_DISK_RE.
	reNewDiskFile = regexp.MustCompile(`^(([^/:\s]+):)?(\d+(\.\d+)?)$`)
	// reCloudinitFile is Drive.pm drive_is_cloudinit's match of a file.
	reCloudinitFile = regexp.MustCompile(`[:/](?:vm-\d+-)?cloudinit(?:\.(?:raw|qcow2|vmdk))?$`)
	reImagesVol     = regexp.MustCompile(`^(\d+)/(vm-(\d+)-[^/\s]+\.(raw|qcow2|vmdk))$`)
	reDiskNumber    = regexp.MustCompile(`^vm-\d+-disk-(\d+)(?:\.[a-z0-9]+)?$`)
)

// cloudinitSize is qemu-server Cloudinit.pm CLOUDINIT_DISK_SIZE (4 MiB).
const cloudinitSize = 4 << 20

// drive is a parsed drive value: its file and its options in order.
type drive struct {
	file string
	opts [][2]string
}

func parseDrive(val string) drive {
	parts := strings.Split(val, ",")
	d := drive{file: parts[0]}
	if k, v, ok := strings.Cut(parts[0], "="); ok && k == "file" {
		d.file = v
	}
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(p, "=")
		d.opts = append(d.opts, [2]string{k, v})
	}
	return d
}

func (d drive) opt(k string) (string, bool) {
	for _, o := range d.opts {
		if o[0] == k {
			return o[1], true
		}
	}
	return "", false
}

// print is qemu-server print_drive: the file first, then the options by
// name; set overrides or adds options, drop removes them.
func (d drive) print(set map[string]string, drop ...string) string {
	m := map[string]string{}
	for _, o := range d.opts {
		m[o[0]] = o[1]
	}
	for k, v := range set {
		m[k] = v
	}
	for _, k := range drop {
		delete(m, k)
	}
	out := d.file
	for _, k := range sortedKeys(m) {
		out += "," + k + "=" + m[k]
	}
	return out
}

// isCloudinitAlloc: the value asks for a new cloud-init drive.
func isCloudinitAlloc(val string) bool {
	f := parseDrive(val).file
	return f == "cloudinit" || strings.HasSuffix(f, ":cloudinit")
}

// isImportAlloc: the value imports a disk (import-from).
func isImportAlloc(val string) bool {
	_, ok := parseDrive(val).opt("import-from")
	return ok
}

// allocDrives are the drives of params that create_disks allocates.
func allocDrives(params map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range params {
		if reDiskKey.MatchString(k) && (isCloudinitAlloc(v) || isImportAlloc(v)) {
			out[k] = v
		}
	}
	return out
}

// checkDriveParams is qemu-server API2/Qemu.pm $check_drive_param's
// import-from rules: the special syntax "<storage ID>:0,import-from=..."
// and, for efidisk0 and tpmstate0, the options an import needs.
func checkDriveParams(params map[string]string) error {
	for _, k := range sortedKeys(params) {
		if !reDiskKey.MatchString(k) || !isImportAlloc(params[k]) {
			continue
		}
		d := parseDrive(params[k])
		m := reNewDiskFile.FindStringSubmatch(d.file)
		if m == nil || m[3] != "0" {
			return paramFail(ParamErrors{k: "'import-from' requires special syntax - use <storage ID>:0,import-from=<source>"})
		}
		switch k {
		case "efidisk0":
			for _, req := range []string{"efitype", "pre-enrolled-keys"} {
				if _, ok := d.opt(req); !ok {
					return paramFail(ParamErrors{k: fmt.Sprintf("need to specify '%s' when using 'import-from'", req)})
				}
			}
		case "tpmstate0":
			if _, ok := d.opt("version"); !ok {
				return paramFail(ParamErrors{k: "need to specify 'version' when using 'import-from'"})
			}
		}
	}
	return nil
}

// sourceVolume is an import-from source that is a storage's volume.
type sourceVolume struct {
	volid, storage string
	vtype          string // images or import (or what else parse_volname says)
	format         string // the volume's format; "ova+vmdk" for an OVA member
	owner          int    // the owning VM of an images volume
	path           string
	ova, member    string // an OVA member: the archive's path and the member's name
}

// parseSource is checked_parse_volname of an import-from source of a
// storage (pve-storage Plugin.pm parse_volname; qemu-server Drive.pm
// checked_parse_volname). ok is false for a source that is not a volume
// id (an absolute path).
func (s *Server) parseSource(src string) (sourceVolume, bool, error) {
	sid, name, ok := strings.Cut(src, ":")
	if !ok || strings.HasPrefix(src, "/") {
		return sourceVolume{}, false, nil
	}
	s.mu.Lock()
	exists := s.storages[sid]
	s.mu.Unlock()
	if !exists {
		return sourceVolume{}, true, fail("storage '%s' does not exist", sid)
	}
	v := sourceVolume{volid: src, storage: sid}
	if sid != dirStorage {
		return v, true, fail("emulator: import-from a volume of storage '%s' is not emulated", sid)
	}
	if m := reImagesVol.FindStringSubmatch(name); m != nil {
		v.vtype, v.format = "images", m[4]
		v.owner, _ = strconv.Atoi(m[3])
		v.path = filepath.Join(s.storageDir(), "images", m[1], m[2])
		return v, true, nil
	}
	dv, ok := parseDirVolname(name)
	if !ok {
		return v, true, fail("unable to parse directory volume name '%s'", name)
	}
	v.vtype, v.format = dv.vtype, "raw"
	v.path = filepath.Join(s.storageDir(), vtypeSubdir[dv.vtype], dv.file)
	if dv.vtype == "import" {
		if archive, member, ok := strings.Cut(dv.file, ".ova/"); ok {
			v.ova, v.member = filepath.Join(s.storageDir(), "import", archive+".ova"), member
			v.format = "ova+" + member[strings.LastIndex(member, ".")+1:]
		} else {
			v.format = dv.file[strings.LastIndex(dv.file, ".")+1:]
		}
		if v.format == "ovf" || v.format == "ova" {
			return v, true, fail("volume '%s' - not a QEMU image format '%s'", src, v.format)
		}
	}
	return v, true, nil
}

// checkStorageAccess is qemu-server API2/Qemu.pm $check_storage_access
// for the drives of settings that allocate: a new disk needs
// Datastore.AllocateSpace on its storage, which must hold images; an
// import source of a storage must be an images or import volume, an OVA
// member needs a working storage with images that is file based (and
// Datastore.AllocateSpace on it); an images source needs VM.Clone on its
// owner, any other check_volume_access (Datastore.Allocate on the
// storage, or for an import volume Datastore.AllocateSpace or
// Datastore.Audit); an absolute path is root@pam's alone. A cloud-init
// drive needs nothing here. Called before the worker (s.mu not held).
func (s *Server) checkStorageAccess(authid string, settings map[string]string, workingStorage string) error {
	for _, k := range sortedKeys(settings) {
		if !reDiskKey.MatchString(k) {
			continue
		}
		d := parseDrive(settings[k])
		if isCloudinitAlloc(settings[k]) || isCDROM(settings[k]) {
			continue
		}
		if m := reNewDiskFile.FindStringSubmatch(d.file); m != nil {
			if m[2] == "" {
				return fail("no storage ID specified (and no default storage)")
			}
			if err := s.checkPrivs(authid, "/storage/"+m[2], []string{"Datastore.AllocateSpace"}, false); err != nil {
				return err
			}
			s.mu.Lock()
			exists := s.storages[m[2]]
			images := contentSet(s.storageContentLocked(m[2], defaultContent(m[2])))["images"]
			s.mu.Unlock()
			if !exists {
				return fail("storage '%s' does not exist", m[2])
			}
			if !images {
				return paramFail(ParamErrors{"storage": fmt.Sprintf("storage '%s' does not support vm images", m[2])})
			}
		}
		src, ok := d.opt("import-from")
		if !ok {
			continue
		}
		if err := s.checkImportSource(authid, k, src, workingStorage); err != nil {
			return err
		}
	}
	return nil
}

// checkImportSource is $check_storage_access's import-from part for the
// drive key k.
func (s *Server) checkImportSource(authid, k, src, workingStorage string) error {
	v, managed, err := s.parseSource(src)
	if err != nil {
		return err
	}
	if !managed {
		if authid != "root@pam" {
			return fail("Only root can pass arbitrary filesystem paths.")
		}
		return nil
	}
	if v.vtype != "images" && v.vtype != "import" {
		return paramFail(ParamErrors{k: fmt.Sprintf("%s has wrong type '%s' - needs to be 'images' or 'import'", src, v.vtype)})
	}
	if v.ova != "" {
		id, param := v.storage, k
		if workingStorage != "" {
			id, param = workingStorage, "import-working-storage"
		}
		s.mu.Lock()
		ok := id == dirStorage && contentSet(s.storageContentLocked(id, defaultContent(id)))["images"]
		s.mu.Unlock()
		if !ok {
			return paramFail(ParamErrors{param: fmt.Sprintf("import working storage '%s' does not support 'images' content type or is not file based.", id)})
		}
		if err := s.checkPrivs(authid, "/storage/"+id, []string{"Datastore.AllocateSpace"}, false); err != nil {
			return err
		}
	}
	if v.owner > 0 {
		return s.checkPrivs(authid, "/vms/"+strconv.Itoa(v.owner), []string{"VM.Clone"}, false)
	}
	if authid == "root@pam" || s.privileges(authid, "/storage/"+v.storage)["Datastore.Allocate"] {
		return nil
	}
	if v.vtype == "import" {
		return s.checkPrivs(authid, "/storage/"+v.storage, []string{"Datastore.AllocateSpace", "Datastore.Audit"}, true)
	}
	return fail("missing privileges to access %s", src)
}

// diskCreator is one create_disks run: the volumes it allocated so far
// (freed when it fails), for VM vmid, logging to logf.
type diskCreator struct {
	s       *Server
	vmid    int
	pid     uint32
	logf    func(format string, a ...any)
	taken   map[string]bool // thin volume names in use (configs and this run)
	vollist []string
}

// createDisks is qemu-server create_disks for the allocating drives of
// settings (allocDrives), in key order, for VM vmid whose config and
// pending values are conf: each drive's new value by key. On error the
// volumes it allocated are freed. Runs under the VM's config lock, without
// s.mu: the copies may be large.
func (s *Server) createDisks(ctx context.Context, vmid int, pid uint32, settings, conf map[string]string, logf func(string, ...any)) (map[string]string, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	dc := &diskCreator{s: s, vmid: vmid, pid: pid, logf: logf, taken: map[string]bool{}}
	s.mu.Lock()
	for _, v := range s.vms {
		for _, tv := range thinVolumesOf(v.conf) {
			dc.taken[tv.name] = true
		}
	}
	s.mu.Unlock()
	for _, tv := range thinVolumesOf(conf) {
		dc.taken[tv.name] = true
	}
	res := map[string]string{}
	for _, k := range sortedKeys(settings) {
		var val string
		var err error
		if isCloudinitAlloc(settings[k]) {
			val, err = dc.cloudinit(k, settings[k], conf, res)
		} else {
			val, err = dc.importDisk(ctx, k, settings[k])
		}
		if err != nil {
			dc.freeAll()
			return nil, err
		}
		res[k] = val
		logf("%s: successfully created disk '%s'", k, val)
	}
	return res, nil
}

// cloudinit allocates a cloud-init drive for key k: vm-<vmid>-cloudinit
// (.qcow2 on a file-based storage, unless format says otherwise), 4 MiB,
// media=cdrom; a second one is refused.
func (dc *diskCreator) cloudinit(k, val string, conf, res map[string]string) (string, error) {
	d := parseDrive(val)
	sid, _, _ := strings.Cut(d.file, ":")
	if d.file == "cloudinit" {
		return "", errors.New("no storage ID specified (and no default storage)")
	}
	for _, m := range []map[string]string{conf, res} {
		for _, other := range sortedKeys(m) {
			if other != k && reDiskKey.MatchString(other) && reCloudinitFile.MatchString(parseDrive(m[other]).file) {
				return "", fmt.Errorf("%s - cloud-init drive is already attached at '%s'", k, other)
			}
		}
	}
	name := fmt.Sprintf("vm-%d-cloudinit", dc.vmid)
	var volid string
	switch sid {
	case dirStorage:
		f, ok := d.opt("format")
		if !ok {
			f = "qcow2"
		}
		name += "." + f
		p, err := dc.allocDirFile(name)
		if err != nil {
			return "", err
		}
		if err := writeEmptyImage(p, f, cloudinitSize); err != nil {
			return "", err
		}
		volid = dirStorage + ":" + strconv.Itoa(dc.vmid) + "/" + name
	case thinStorage:
		if dc.taken[name] {
			return "", fmt.Errorf("lvcreate 'pve/%s' error:   Logical Volume \"%s\" already exists in volume group \"pve\"", name, name)
		}
		dc.taken[name] = true
		volid = thinStorage + ":" + name
	default:
		return "", fmt.Errorf("storage '%s' does not exist", sid)
	}
	dc.vollist = append(dc.vollist, volid)
	d.file = volid
	return d.print(map[string]string{"media": "cdrom"}, "format"), nil
}

// importDisk is create_disks' import-from branch for key k: the source
// checked (an import volume as untrusted: its format as named, no
// backing file; an OVA member extracted to a volume of the working
// storage first, as PVE::GuestImport does), then copied into a new
// volume vm-<vmid>-disk-N of the target storage, whose size (the
// source's virtual size) the drive records.
func (dc *diskCreator) importDisk(ctx context.Context, k, val string) (string, error) {
	d := parseDrive(val)
	target := reNewDiskFile.FindStringSubmatch(d.file)[2]
	src, _ := d.opt("import-from")
	v, managed, err := dc.s.parseSource(src)
	if err != nil {
		return "", err
	}
	var path string
	var info imageInfo
	extracted := ""
	switch {
	case !managed:
		path = src
		if st, err := os.Stat(src); err != nil || !st.Mode().IsRegular() {
			return "", fmt.Errorf("can't find file '%s'", src)
		}
		if info, err = probeImage(path, ""); err != nil {
			return "", err
		}
	case v.vtype == "import" && v.ova == "":
		// an import volume is untrusted: its format as named, no backing file
		path = v.path
		if info, err = probeImageAs(path, v.format, dc.s.reportedPath(path)); err != nil {
			return "", err
		}
	default:
		if v.ova != "" {
			if v, err = dc.extract(v); err != nil {
				return "", err
			}
			extracted = v.volid
		}
		path = v.path
		if info, err = probeImage(path, v.format); err != nil {
			return "", fmt.Errorf("cannot import from '%s' - could not get size of %s", v.volid, v.volid)
		}
	}
	volid, dst, err := dc.allocImport(target, info.format)
	if err != nil {
		return "", fmt.Errorf("cannot import from '%s' - %w", src, err)
	}
	if err := copyImage(ctx, path, dst); err != nil {
		return "", fmt.Errorf("cannot import from '%s' - %w", src, err)
	}
	if extracted != "" {
		dc.freeVolume(extracted)
		dc.logf("cleaned up extracted image %s", extracted)
	}
	d.file = volid
	return d.print(map[string]string{"size": formatSize(info.size)}, "format", "import-from"), nil
}

// extract is PVE::GuestImport extract_disk_from_import_file: the OVA's
// member extracted to a temporary directory in the working storage's
// image directory, checked as untrusted, and moved into a new volume of
// it (vm-<vmid>-disk-N.<format>), which the import then copies from and
// frees.
func (dc *diskCreator) extract(v sourceVolume) (sourceVolume, error) {
	dc.logf("extracting %s", v.volid)
	dir := filepath.Join(dc.s.storageDir(), "images", strconv.Itoa(dc.vmid), fmt.Sprintf("tmp_%d_%d", dc.pid, dc.vmid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return v, err
	}
	defer os.RemoveAll(dir)
	archiveVolid := dirStorage + ":import/" + filepath.Base(v.ova)
	p, err := extractOVAMember(v.ova, v.member, archiveVolid, dir)
	if err != nil {
		return v, fmt.Errorf("error during extraction: %w", err)
	}
	inner := strings.TrimPrefix(v.format, "ova+")
	if _, err := probeImage(p, inner); err != nil {
		return v, fmt.Errorf("error during extraction: %w", err)
	}
	name, err := dc.freeDirDiskName(inner)
	if err != nil {
		return v, err
	}
	target := filepath.Join(dc.s.storageDir(), "images", strconv.Itoa(dc.vmid), name)
	dc.logf("renaming %s to %s", dc.s.reportedPath(p), dc.s.reportedPath(target))
	if err := os.Rename(p, target); err != nil {
		return v, fmt.Errorf("error during extraction: unable to move - %w", err)
	}
	volid := dirStorage + ":" + strconv.Itoa(dc.vmid) + "/" + name
	dc.vollist = append(dc.vollist, volid)
	dc.logf("finished extracting to %s", volid)
	return sourceVolume{volid: volid, storage: dirStorage, vtype: "images", format: inner, owner: dc.vmid, path: target}, nil
}

// allocImport allocates the import's target volume: on the dir storage
// vm-<vmid>-disk-N.<format> in the source's format (the emulator does
// not convert); on the thin pool vm-<vmid>-disk-N (raw), whose bytes the
// emulator keeps under the VM's directory (volumes/), unconverted.
func (dc *diskCreator) allocImport(storage, format string) (volid, path string, err error) {
	switch storage {
	case dirStorage:
		name, err := dc.freeDirDiskName(format)
		if err != nil {
			return "", "", err
		}
		p, err := dc.allocDirFile(name)
		if err != nil {
			return "", "", err
		}
		volid = dirStorage + ":" + strconv.Itoa(dc.vmid) + "/" + name
		dc.vollist = append(dc.vollist, volid)
		return volid, p, nil
	case thinStorage:
		for n := 0; ; n++ {
			name := fmt.Sprintf("vm-%d-disk-%d", dc.vmid, n)
			if dc.taken[name] {
				continue
			}
			dc.taken[name] = true
			dir := filepath.Join(dc.s.vmDir(dc.vmid), "volumes")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return "", "", err
			}
			volid = thinStorage + ":" + name
			dc.vollist = append(dc.vollist, volid)
			return volid, filepath.Join(dir, name), nil
		}
	}
	return "", "", fmt.Errorf("storage '%s' does not exist", storage)
}

// freeDirDiskName is pve-storage Plugin.pm find_free_diskname on the dir
// storage: the lowest vm-<vmid>-disk-N no file of the VM's image
// directory has, whatever its format.
func (dc *diskCreator) freeDirDiskName(format string) (string, error) {
	files, err := os.ReadDir(filepath.Join(dc.s.storageDir(), "images", strconv.Itoa(dc.vmid)))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	used := map[int]bool{}
	for _, f := range files {
		if m := reDiskNumber.FindStringSubmatch(f.Name()); m != nil {
			n, _ := strconv.Atoi(m[1])
			used[n] = true
		}
	}
	n := 0
	for used[n] {
		n++
	}
	return fmt.Sprintf("vm-%d-disk-%d.%s", dc.vmid, n, format), nil
}

// allocDirFile creates the image file name of the VM on the dir storage
// (Plugin.pm alloc_image: "disk image '...' already exists").
func (dc *diskCreator) allocDirFile(name string) (string, error) {
	dir := filepath.Join(dc.s.storageDir(), "images", strconv.Itoa(dc.vmid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("disk image '%s' already exists", dc.s.reportedPath(p))
	}
	if err != nil {
		return "", err
	}
	return p, f.Close()
}

// freeAll frees the volumes this run allocated (create_disks on error:
// vdisk_free of each).
func (dc *diskCreator) freeAll() {
	for _, volid := range dc.vollist {
		dc.freeVolume(volid)
	}
	dc.vollist = nil
}

func (dc *diskCreator) freeVolume(volid string) {
	dc.vollist = slices.DeleteFunc(dc.vollist, func(v string) bool { return v == volid })
	sid, name, _ := strings.Cut(volid, ":")
	switch sid {
	case dirStorage:
		_ = os.Remove(filepath.Join(dc.s.storageDir(), "images", name))
	case thinStorage:
		delete(dc.taken, name)
		_ = os.Remove(filepath.Join(dc.s.vmDir(dc.vmid), "volumes", name))
	}
}

// copyImage copies the image at src to dst (created already) verbatim.
func copyImage(ctx context.Context, src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, &ctxReader{ctx: ctx, r: in})
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// ctxReader stops a copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// writeEmptyImage writes an empty image of size bytes: a raw file is
// sparse; a qcow2 gets only its version 2 header (magic, version,
// cluster bits 16, size: enough for probeImage, not for qemu-img).
func writeEmptyImage(p, format string, size int64) error {
	if format != "qcow2" {
		return os.Truncate(p, size)
	}
	hdr := make([]byte, 72)
	copy(hdr, qcow2Magic)
	binary.BigEndian.PutUint32(hdr[4:], 2)
	binary.BigEndian.PutUint32(hdr[20:], 16)
	binary.BigEndian.PutUint64(hdr[24:], uint64(size))
	return os.WriteFile(p, hdr, 0o640)
}

// formatSize is pve-common JSONSchema.pm format_size: the largest unit
// (K, M, G, T) that divides the size, else bytes.
func formatSize(n int64) string {
	for _, u := range []string{"T", "G", "M", "K"} {
		shift := map[string]uint{"T": 40, "G": 30, "M": 20, "K": 10}[u]
		if n > 0 && n%(1<<shift) == 0 {
			return strconv.FormatInt(n>>shift, 10) + u
		}
	}
	return strconv.FormatInt(n, 10)
}

// checkCicustom is what a VM's start reads of cicustom when the VM has a
// cloud-init drive (qemu-server Cloudinit.pm generate_cloudinit_config,
// read_cloudinit_snippets_file): each file must be a snippets volume
// ("... is not in the snippets directory") that exists
// (PVE::Storage::abs_filesystem_path: "can't find file '...'"). The
// storage's content list is not consulted, and no privilege is checked
// on the volumes: VM.Config.Cloudinit on the VM sets cicustom.
func (s *Server) checkCicustom(vmid int, conf map[string]string) error {
	ci := conf["cicustom"]
	if ci == "" {
		return nil
	}
	has := false
	for k, v := range conf {
		f := parseDrive(v).file
		if reDiskKey.MatchString(k) && strings.Contains(f, fmt.Sprintf("vm-%d-cloudinit", vmid)) {
			has = true
		}
	}
	if !has {
		return nil
	}
	files := map[string]string{}
	for _, p := range strings.Split(ci, ",") {
		k, v, _ := strings.Cut(p, "=")
		files[k] = v
	}
	for _, k := range []string{"network", "user", "meta", "vendor"} {
		volid, ok := files[k]
		if !ok {
			continue
		}
		if err := s.checkSnippet(volid); err != nil {
			return err
		}
	}
	return nil
}

// checkSnippet is read_cloudinit_snippets_file's checks of one volume.
func (s *Server) checkSnippet(volid string) error {
	sid, name, ok := strings.Cut(volid, ":")
	if !ok {
		return fail("unable to parse volume ID '%s'", volid)
	}
	s.mu.Lock()
	exists := s.storages[sid]
	s.mu.Unlock()
	if !exists {
		return fail("storage '%s' does not exist", sid)
	}
	if sid != dirStorage {
		return fail("%s is not in the snippets directory", volid)
	}
	vtype := "images"
	if dv, ok := parseDirVolname(name); ok {
		vtype = dv.vtype
	} else if !reImagesVol.MatchString(name) {
		return fail("unable to parse directory volume name '%s'", name)
	}
	if vtype != "snippets" {
		return fail("%s is not in the snippets directory", volid)
	}
	if st, err := os.Stat(filepath.Join(s.storageDir(), "snippets", strings.TrimPrefix(name, "snippets/"))); err != nil || !st.Mode().IsRegular() {
		return fail("can't find file '%s'", volid)
	}
	return nil
}
