package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandbox"
)

// Tags a build sets.
const (
	// TagBuilding marks a VM a build has created and not finished: the
	// next build of its name destroys it.
	TagBuilding = "pvei-building"
	// TagTemplate marks a finished template of this project's build.
	TagTemplate = "pvei-template"
	// TagInspect is the reference plugin's tag of its VMs.
	TagInspect = "inspect"
)

// BuiltinTag is the reference plugin's tag of built-in recipe name.
func BuiltinTag(name string) string { return "builtin-" + name }

// Proxmox is what a build needs of the Proxmox API (pveapi.Client, logged
// in as an operator: see the package doc's Privileges).
type Proxmox interface {
	ListVMs(ctx context.Context) ([]sandbox.VMInfo, error)
	NextID(ctx context.Context) (int, error)
	StorageVolumes(ctx context.Context, storage, content string) ([]pveapi.StorageVolume, error)
	VolumePath(ctx context.Context, volid string) (string, error)
	Storage(ctx context.Context, storage string) (pveapi.StorageConfig, error)
	DownloadURL(ctx context.Context, storage string, d pveapi.Download) (string, error)
	CreateVM(ctx context.Context, vmid int, conf map[string]string) error
	ResizeDisk(ctx context.Context, vmid int, sizeGiB int) error
	StartVM(ctx context.Context, vmid int) error
	ShutdownVM(ctx context.Context, vmid int, timeout time.Duration, force bool) error
	DeleteVM(ctx context.Context, vmid int) error
	VMConfig(ctx context.Context, vmid int) (map[string]string, error)
	UpdateVMConfig(ctx context.Context, vmid int, set map[string]string, del []string) error
	ConvertToTemplate(ctx context.Context, vmid int) error
}

// AgentResult is how a command run through the guest agent ended.
type AgentResult struct {
	Exit   int
	Output string
	// TimedOut is true when the command was killed at its timeout.
	TimedOut bool
}

// Agent runs commands in a build VM through its guest agent.
type Agent interface {
	Exec(ctx context.Context, vmid int, argv []string, timeout time.Duration) (AgentResult, error)
}

// Host is what a build does on the node itself.
type Host interface {
	// WriteFile replaces path's content atomically.
	WriteFile(path string, data []byte) error
	// Remove deletes path (no error when it is absent).
	Remove(path string) error
	// Checksum is the lower-case hex digest (alg sha256 or sha512) of
	// the file at path.
	Checksum(path, alg string) (string, error)
	// Fetch reads a small document (a checksum list) over HTTP(S), at
	// most limit bytes.
	Fetch(ctx context.Context, url string, limit int64) ([]byte, error)
}

// Options are a build's settings.
type Options struct {
	// Name is the template's VM name (the name sandboxes ask for).
	Name string
	// Recipe says what to build (its Image may come from --from).
	Recipe Recipe
	// Storage holds the VM's disk and its cloud-init drive (local-lvm);
	// ImageStorage the downloaded image (local, content import);
	// SnippetStorage the cloud-init snippets (local, content snippets).
	Storage, ImageStorage, SnippetStorage string
	// WorkStorage is where qemu-server extracts an OVA's disk before it
	// imports it (the create's import-working-storage: a file-based
	// storage with content images); "" is Proxmox's default, the OVA's
	// own storage.
	WorkStorage string
	// Bridge is the build VM's NIC (it needs a way to the package
	// mirrors); the template keeps no NIC.
	Bridge string
	// AgentWait bounds the wait for the guest agent (30m: cloud-init
	// installs it with the packages); CloudInitWait the wait for
	// cloud-init (30m); ShutdownWait the guest's power-off (3m, then a
	// stop).
	AgentWait, CloudInitWait, ShutdownWait time.Duration
	// AgentPoll is the pause between agent probes (5s).
	AgentPoll time.Duration
	// KeepFailed leaves a failed build's VM (still tagged building) for
	// a look; by default it is destroyed.
	KeepFailed bool
	// KeepCancelled leaves the VM of a build ended by its context (the
	// daemon stopping) for the next build of the name to destroy, rather
	// than hold up the shutdown destroying it.
	KeepCancelled bool
	// Progress receives one line per step; Log the same as debug records
	// (and a failed snippet removal as a warning).
	Progress io.Writer
	Log      *slog.Logger
}

func (o *Options) defaults() {
	if o.AgentWait == 0 {
		o.AgentWait = 30 * time.Minute
	}
	if o.CloudInitWait == 0 {
		o.CloudInitWait = 30 * time.Minute
	}
	if o.ShutdownWait == 0 {
		o.ShutdownWait = 3 * time.Minute
	}
	if o.AgentPoll == 0 {
		o.AgentPoll = 5 * time.Second
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

// Result is what a build produced.
type Result struct {
	// VMID is the template's id.
	VMID int
	// Reused is true when an earlier build's template was found.
	Reused bool
	// Report is the template's hardened-profile check.
	Report hardening.Report
}

// Builder builds templates.
type Builder struct {
	px    Proxmox
	agent Agent
	host  Host
	o     Options
}

// Validate checks the options without calling anything.
func (o Options) Validate() error {
	if err := ValidName(o.Name); err != nil {
		return err
	}
	if o.WorkStorage != "" {
		if err := ValidStorage("work-storage", o.WorkStorage); err != nil {
			return err
		}
	}
	for _, s := range [][2]string{{"storage", o.Storage}, {"image-storage", o.ImageStorage}, {"snippet-storage", o.SnippetStorage}} {
		if err := ValidStorage(s[0], s[1]); err != nil {
			return err
		}
	}
	if o.Bridge == "" {
		return errors.New("no bridge for the build VM")
	}
	img := o.Recipe.Image
	if img.Unsupported != "" && img.Volume == "" {
		return fmt.Errorf("recipe %s: %s", o.Recipe.Name, img.Unsupported)
	}
	if img.URL == "" && img.Volume == "" {
		return errors.New("no image: want a recipe or --from")
	}
	if _, err := userData(o.Recipe.Packages); err != nil {
		return fmt.Errorf("recipe %s: %w", o.Recipe.Name, err)
	}
	return nil
}

// New returns a Builder for one build.
func New(px Proxmox, agent Agent, host Host, o Options) (*Builder, error) {
	o.defaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return &Builder{px: px, agent: agent, host: host, o: o}, nil
}

// say writes a progress line and logs it.
func (b *Builder) say(step, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	fmt.Fprintf(b.o.Progress, "%-8s %s\n", step+":", msg)
	b.o.Log.Debug(msg, "step", step, "template", b.o.Name)
}

// Run builds the template, or finds the one an earlier run built.
func (b *Builder) Run(ctx context.Context) (Result, error) {
	if id, ok, err := b.find(ctx); err != nil || ok {
		if ok {
			b.say("find", "template %q is VM %d, built earlier: reused", b.o.Name, id)
		}
		return Result{VMID: id, Reused: ok}, err
	}
	importFrom, err := b.image(ctx)
	if err != nil {
		return Result{}, err
	}
	cicustom, snippets, err := b.seed(ctx)
	if err != nil {
		return Result{}, err
	}
	defer b.removeSnippets(snippets)
	vmid, err := b.create(ctx, importFrom, cicustom)
	if err != nil {
		return Result{}, err
	}
	rep, err := b.finish(ctx, vmid)
	if err != nil {
		return Result{VMID: vmid}, b.failed(ctx, vmid, err)
	}
	b.say("done", "template %q is VM %d", b.o.Name, vmid)
	return Result{VMID: vmid, Report: rep}, nil
}

// finish is the build from the created VM to the tagged template.
func (b *Builder) finish(ctx context.Context, vmid int) (hardening.Report, error) {
	if err := b.boot(ctx, vmid); err != nil {
		return hardening.Report{}, err
	}
	return b.seal(ctx, vmid)
}

// failed destroys a failed build's VM (unless KeepFailed, or
// KeepCancelled and ctx was cancelled) and says so.
func (b *Builder) failed(ctx context.Context, vmid int, cause error) error {
	if b.o.KeepFailed || (b.o.KeepCancelled && errors.Is(ctx.Err(), context.Canceled)) {
		b.say("failed", "VM %d kept (tagged %s: the next build destroys it)", vmid, TagBuilding)
		return cause
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := b.px.DeleteVM(ctx, vmid); errors.Is(err, sandbox.ErrNotFound) {
		return cause
	} else if err != nil {
		return errors.Join(cause, fmt.Errorf("destroy the failed build's VM %d (tagged %s: the next build destroys it): %w", vmid, TagBuilding, err))
	}
	b.say("failed", "VM %d destroyed", vmid)
	return cause
}

// wantTags are a finished template's tags.
func (b *Builder) wantTags() []string {
	tags := []string{TagInspect, TagTemplate}
	if b.o.Recipe.Name != "" {
		tags = append(tags, BuiltinTag(b.o.Recipe.Name))
	}
	slices.Sort(tags)
	return tags
}

// find reuses a finished template of the name, destroys half-built VMs
// of it, and refuses any other VM of it.
func (b *Builder) find(ctx context.Context) (int, bool, error) {
	vms, err := b.px.ListVMs(ctx)
	if err != nil {
		return 0, false, err
	}
	for _, v := range vms {
		if v.Name != b.o.Name {
			continue
		}
		building := slices.Contains(v.Tags, TagBuilding)
		if finished(v, b.wantTags()) {
			return v.VMID, true, nil
		}
		if !building {
			return 0, false, fmt.Errorf("VM %d is named %q and is not this build's (tags %q, template %v): pick another name, or remove it (qm destroy %d) to build anew",
				v.VMID, b.o.Name, strings.Join(v.Tags, ";"), v.Template, v.VMID)
		}
		b.say("find", "VM %d is a half-built %q from an earlier run: destroying it", v.VMID, b.o.Name)
		if err := b.px.DeleteVM(ctx, v.VMID); err != nil {
			return 0, false, fmt.Errorf("destroy half-built VM %d: %w", v.VMID, err)
		}
	}
	return 0, false, nil
}

// finished reports whether v is a finished template of this project's
// build carrying want.
func finished(v sandbox.VMInfo, want []string) bool {
	return v.Template && !slices.Contains(v.Tags, TagBuilding) && hasAll(v.Tags, want)
}

// Existing finds, without changing anything, the finished template named
// name that a build of recipe ("" for a build from an image alone) would
// reuse: its id, and whether there is one.
func Existing(ctx context.Context, px interface {
	ListVMs(ctx context.Context) ([]sandbox.VMInfo, error)
}, name, recipe string) (int, bool, error) {
	vms, err := px.ListVMs(ctx)
	if err != nil {
		return 0, false, err
	}
	want := (&Builder{o: Options{Recipe: Recipe{Name: recipe}}}).wantTags()
	for _, v := range vms {
		if v.Name == name && finished(v, want) {
			return v.VMID, true, nil
		}
	}
	return 0, false, nil
}

func hasAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// image makes sure the image is on the node and returns the import-from
// volume.
func (b *Builder) image(ctx context.Context) (string, error) {
	img := b.o.Recipe.Image
	volid := img.Volume
	if volid == "" {
		volid = b.o.ImageStorage + ":import/" + img.File
	}
	importFrom := volid
	if img.Disk != "" {
		importFrom += "/" + img.Disk
	}
	storage, _, _ := strings.Cut(volid, ":")
	if img.Disk != "" {
		if err := b.checkWorkStorage(ctx, storage); err != nil {
			return "", err
		}
	}
	vols, err := b.px.StorageVolumes(ctx, storage, "import")
	if err != nil {
		return "", err
	}
	present := slices.ContainsFunc(vols, func(v pveapi.StorageVolume) bool { return v.VolID == volid })
	alg, sum, err := b.checksum(ctx)
	if err != nil {
		return "", err
	}
	switch {
	case present && sum == "":
		b.say("image", "%s is on the node (no checksum to verify it against)", volid)
		return importFrom, nil
	case present:
		p, err := b.px.VolumePath(ctx, volid)
		if err != nil {
			return "", err
		}
		got, err := b.host.Checksum(p, alg)
		if err != nil {
			return "", fmt.Errorf("checksum of %s: %w", p, err)
		}
		if got == sum {
			b.say("image", "%s is on the node, %s verified", volid, alg)
			return importFrom, nil
		}
		if img.URL == "" {
			return "", fmt.Errorf("%s: %s %s, want %s", volid, alg, got, sum)
		}
		b.say("image", "%s is on the node with another %s: downloading it again", volid, alg)
	case img.URL == "":
		return "", fmt.Errorf("volume %s is not on storage %s (upload the image to its import directory first)", volid, storage)
	}
	if sum == "" {
		b.say("image", "downloading %s to %s (no checksum: not verified)", img.URL, volid)
	} else {
		b.say("image", "downloading %s to %s (Proxmox verifies its %s)", img.URL, volid, alg)
	}
	if _, err := b.px.DownloadURL(ctx, storage, pveapi.Download{URL: img.URL, Content: "import", Filename: img.File, Checksum: sum, ChecksumAlgorithm: alg}); err != nil {
		return "", err
	}
	return importFrom, nil
}

// checkWorkStorage refuses, before anything is made, an OVA build whose
// extraction storage qemu-server's create would refuse (API2/Qemu.pm
// create_disks' import check: the import working storage, by default the
// OVA's own, must have content images and a path).
func (b *Builder) checkWorkStorage(ctx context.Context, source string) error {
	id := b.o.WorkStorage
	if id == "" {
		id = source
	}
	sc, err := b.px.Storage(ctx, id)
	if err != nil {
		return err
	}
	if !sc.Has("images") || sc.Path == "" {
		return fmt.Errorf("an OVA's disk is extracted on a file-based storage with content images before its import, and %s (content %s) is not one: add images as root (pvesm set %s --content %s,images) or name another with --work-storage",
			id, strings.Join(sc.Content, ","), id, strings.Join(sc.Content, ","))
	}
	return nil
}

// checksum is the image's expected digest: given, or read from the
// checksum list beside it ("", "" when neither).
func (b *Builder) checksum(ctx context.Context) (alg, sum string, err error) {
	img := b.o.Recipe.Image
	if img.Checksum != "" {
		return ParseChecksum(img.Checksum)
	}
	if img.ChecksumURL == "" {
		return "", "", nil
	}
	list, err := b.host.Fetch(ctx, img.ChecksumURL, 1<<20)
	if err != nil {
		return "", "", fmt.Errorf("fetch the checksum list %s: %w", img.ChecksumURL, err)
	}
	sum, err = findChecksum(list, img.File, checksumLen[img.ChecksumAlg])
	if err != nil {
		return "", "", fmt.Errorf("checksum list %s: %w", img.ChecksumURL, err)
	}
	b.say("image", "%s of %s from %s", img.ChecksumAlg, img.File, img.ChecksumURL)
	return img.ChecksumAlg, sum, nil
}

// findChecksum takes file's digest from a sha*sum list ("HEX  FILE" or
// "HEX *FILE" lines).
func findChecksum(list []byte, file string, hexLen int) (string, error) {
	for _, line := range strings.Split(string(list), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && strings.TrimPrefix(f[1], "*") == file {
			s := strings.ToLower(f[0])
			if len(s) != hexLen || !reHex.MatchString(s) {
				return "", fmt.Errorf("the line of %s has no digest of %d hex digits", file, hexLen)
			}
			return s, nil
		}
	}
	return "", fmt.Errorf("no line for %s", file)
}

// seed writes the cloud-init snippets and returns the cicustom value and
// the files' paths.
func (b *Builder) seed(ctx context.Context) (string, []string, error) {
	sc, err := b.px.Storage(ctx, b.o.SnippetStorage)
	if err != nil {
		return "", nil, err
	}
	if !sc.Has("snippets") {
		return "", nil, fmt.Errorf("storage %s does not take snippets (content %s): add it as root with pvesm set %s --content %s,snippets, or name another with --snippet-storage",
			sc.ID, strings.Join(sc.Content, ","), sc.ID, strings.Join(sc.Content, ","))
	}
	dir, err := sc.Dir("snippets")
	if err != nil {
		return "", nil, err
	}
	ud, err := userData(b.o.Recipe.Packages)
	if err != nil {
		return "", nil, err
	}
	user, network := snippetNames(b.o.Name)
	files := []string{path.Join(dir, user), path.Join(dir, network)}
	for i, data := range []string{ud, networkConfig} {
		if err := b.host.WriteFile(files[i], []byte(data)); err != nil {
			return "", nil, fmt.Errorf("write snippet: %w", err)
		}
	}
	b.say("seed", "cloud-init user-data and network-config in %s", dir)
	s := sc.ID + ":snippets/"
	return "user=" + s + user + ",network=" + s + network, files, nil
}

func (b *Builder) removeSnippets(files []string) {
	for _, f := range files {
		if err := b.host.Remove(f); err != nil {
			b.o.Log.Warn("remove a build snippet", "path", f, "err", err)
		}
	}
}

// createConfig is the build VM's configuration: the hardened profile's
// settings, the imported disk, the cloud-init drive and one NIC.
func (b *Builder) createConfig(importFrom, cicustom string) map[string]string {
	conf, _ := hardening.CloneChanges(map[string]string{})
	r := b.o.Recipe
	conf["name"] = b.o.Name
	conf["tags"] = TagBuilding
	conf["memory"] = fmt.Sprint(max(r.MemoryMiB, 512))
	conf["cores"] = fmt.Sprint(max(r.Cores, 1))
	conf["scsihw"] = "virtio-scsi-single"
	conf["scsi0"] = b.o.Storage + ":0,import-from=" + importFrom
	conf["ide2"] = b.o.Storage + ":cloudinit"
	conf["cicustom"] = cicustom
	conf["boot"] = "order=scsi0"
	conf["net0"] = "virtio,bridge=" + b.o.Bridge
	if b.o.WorkStorage != "" && b.o.Recipe.Image.Disk != "" {
		conf["import-working-storage"] = b.o.WorkStorage
	}
	return conf
}

// create makes the build VM (tagged building) and grows its disk. An id
// another client took between NextID and the create is given up for the
// next one (three tries); a create that failed otherwise is cleaned up
// only when the VM of the id is this build's.
func (b *Builder) create(ctx context.Context, importFrom, cicustom string) (int, error) {
	var vmid int
	for try := 1; ; try++ {
		var err error
		if vmid, err = b.px.NextID(ctx); err != nil {
			return 0, err
		}
		b.say("create", "VM %d %q from %s", vmid, b.o.Name, importFrom)
		err = b.px.CreateVM(ctx, vmid, b.createConfig(importFrom, cicustom))
		if err == nil {
			break
		}
		if errors.Is(err, sandbox.ErrExists) && try < 3 {
			b.say("create", "VM %d was taken meanwhile: taking the next id", vmid)
			continue
		}
		if b.ours(ctx, vmid) {
			return 0, b.failed(ctx, vmid, err)
		}
		return 0, err
	}
	if want := b.o.Recipe.DiskGiB; want > 0 {
		conf, err := b.px.VMConfig(ctx, vmid)
		if err != nil {
			return 0, b.failed(ctx, vmid, err)
		}
		if have, ok := diskGiB(conf["scsi0"]); !ok || have < float64(want) {
			if err := b.px.ResizeDisk(ctx, vmid, want); err != nil {
				return 0, b.failed(ctx, vmid, err)
			}
			b.say("create", "disk grown to %d GiB", want)
		}
	}
	return vmid, nil
}

// ours reports whether VM vmid exists as this build's (its name and the
// building tag): a create that failed in its task may leave its config.
func (b *Builder) ours(ctx context.Context, vmid int) bool {
	conf, err := b.px.VMConfig(ctx, vmid)
	return err == nil && conf["name"] == b.o.Name && slices.Contains(strings.Split(conf["tags"], ";"), TagBuilding)
}

// diskGiB reads a drive's size= (K, M, G, T suffixes) in GiB.
func diskGiB(drive string) (float64, bool) {
	for _, p := range strings.Split(drive, ",") {
		v, ok := strings.CutPrefix(p, "size=")
		if !ok || v == "" {
			continue
		}
		mult := map[byte]float64{'K': 1.0 / (1 << 20), 'M': 1.0 / 1024, 'G': 1, 'T': 1024}[v[len(v)-1]]
		var n float64
		if _, err := fmt.Sscanf(v[:len(v)-1], "%g", &n); err != nil || mult == 0 {
			return 0, false
		}
		return n * mult, true
	}
	return 0, false
}
