package templatebuild

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	// DownloadURL fails with a *pveapi.TaskUnfinishedError when it stops
	// waiting for the task it started (see stopDownload).
	DownloadURL(ctx context.Context, storage string, d pveapi.Download) (string, error)
	// StopTask stops a task, even once ctx is done (pveapi.StopTask).
	StopTask(ctx context.Context, upid string) error
	// ImportMetadata lists an OVA's disks (an import-only build's).
	ImportMetadata(ctx context.Context, volid string) (pveapi.ImportMetadata, error)
	CreateVM(ctx context.Context, vmid int, conf map[string]string) error
	ResizeDisk(ctx context.Context, vmid int, sizeGiB int) error
	StartVM(ctx context.Context, vmid int) error
	ShutdownVM(ctx context.Context, vmid int, timeout time.Duration, force bool) error
	DeleteVM(ctx context.Context, vmid int) error
	VMConfig(ctx context.Context, vmid int) (map[string]string, error)
	UpdateVMConfig(ctx context.Context, vmid int, set map[string]string, del []string) error
	ConvertToTemplate(ctx context.Context, vmid int) error
	// The build network (network.go).
	ListVNets(ctx context.Context) ([]sandbox.VNetInfo, error)
	VNetSubnets(ctx context.Context, vnet string) ([]string, error)
	ListSubnetCIDRs(ctx context.Context) ([]string, error)
	CreateZone(ctx context.Context, z sandbox.ZoneSpec) error
	CreateVNet(ctx context.Context, v sandbox.VNetSpec) error
	CreateSubnet(ctx context.Context, s sandbox.SubnetSpec) error
	ApplySDN(ctx context.Context) error
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
	// Open streams a document (an image archive) over HTTP(S), checked
	// as Fetch's: its body, to be closed, and its length (-1 unknown).
	// ctx ending ends the body.
	Open(ctx context.Context, url string) (io.ReadCloser, int64, error)
	// Record, Recorded and Forget keep the ledger of the VMs this node's
	// builds made (ledger.go).
	Record(vmid int, r Record) error
	Recorded(vmid int) (Record, bool, error)
	Forget(vmid int) error
	// RecordImage and RecordedImage keep the ledger of the images this
	// node's builds unpacked from archives (ledger.go).
	RecordImage(r ImageRecord) error
	RecordedImage(volid string) (ImageRecord, bool, error)
}

// Options are a build's settings.
type Options struct {
	// Name is the template's VM name (the name sandboxes ask for).
	Name string
	// Recipe says what to build (its Image may come from --from).
	Recipe Recipe
	// Mode is how: booted (the zero Mode) or import-only (importonly.go),
	// normalized by New.
	Mode Mode
	// Storage holds the VM's disk and its cloud-init drive (local-lvm);
	// ImageStorage the downloaded image (local, content import);
	// SnippetStorage the cloud-init snippets (local, content snippets).
	Storage, ImageStorage, SnippetStorage string
	// WorkStorage is where qemu-server extracts an OVA's disk before it
	// imports it (the create's import-working-storage: a file-based
	// storage with content images); "" is Proxmox's default, the OVA's
	// own storage.
	WorkStorage string
	// Bridge is the build VM's NIC's bridge; "" (the default) is the
	// build network the build makes (network.go). The template keeps no
	// NIC.
	Bridge string
	// Protected are the bridges the host guard treats as management or
	// trusted (firewall.Classify): a Bridge among them is refused unless
	// Unguarded.
	Protected []string
	// Unguarded accepts a Bridge among Protected (--unguarded-bridge).
	Unguarded bool
	// AllowUEFI is the node's [api] allow_uefi: without it an
	// import-only build of an OVA whose OVF asks for UEFI firmware is
	// refused before the VM is created, since every create on the node
	// would refuse the template (its clones boot OVMF).
	AllowUEFI bool
	// BuildCIDR is the build network's subnet (DefaultBuildCIDR).
	BuildCIDR string
	// AgentWait bounds the wait for the guest agent (30m: cloud-init
	// installs it with the packages); CloudInitWait the wait for
	// cloud-init (30m); ShutdownWait the guest's power-off (3m, then a
	// stop).
	AgentWait, CloudInitWait, ShutdownWait time.Duration
	// AgentPoll is the pause between agent probes (5s).
	AgentPoll time.Duration
	// Timeout bounds the whole build, from its first step to the tagged
	// template (DefaultBuildTimeout when 0): a source that sends one byte
	// every few minutes would otherwise hold the build's slot, its name's
	// lock and its image's lock for ever. Past it the build stops as a
	// cancelled one does and fails with a *TimeoutError naming the limit
	// and the step it was in (deadline.go).
	Timeout time.Duration
	// KeepFailed leaves a failed build's VM (still tagged building) for
	// a look; by default it is destroyed.
	KeepFailed bool
	// KeepCancelled leaves the VM of a build ended by its context (the
	// daemon stopping, or the build's Timeout) for the next build of the
	// name to destroy, rather than hold up the shutdown destroying it.
	KeepCancelled bool
	// MaxUnpacked bounds the disk an archive image is unpacked to (its
	// member's size) and the archive's download (DefaultMaxUnpacked when
	// 0).
	MaxUnpacked int64
	// LockDir, when set, holds the lock that keeps two builds from
	// unpacking the same archive image at once (the per-name locks'
	// directory, Lock's).
	LockDir string
	// room holds the room an archive's upload is checked for on the image
	// storage while it runs: the Service's, shared with its uploads; nil
	// (the CLI) is one of the build's own.
	room *roomHolds
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
	if o.BuildCIDR == "" {
		o.BuildCIDR = DefaultBuildCIDR
	}
	if o.AgentPoll == 0 {
		o.AgentPoll = 5 * time.Second
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultBuildTimeout
	}
	if o.MaxUnpacked == 0 {
		o.MaxUnpacked = DefaultMaxUnpacked
	}
	if o.room == nil {
		o.room = &roomHolds{}
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
	// step is the step of the last progress line (say), which a timeout
	// names.
	step stepTracker
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
	if err := o.checkBridge(); err != nil {
		return err
	}
	if err := o.validateImport(); err != nil {
		return err
	}
	img := o.Recipe.Image
	if img.URL == "" && img.Volume == "" {
		return errors.New("no image: want a recipe or --from")
	}
	if img.Unpack != "" && img.Volume == "" && (!reOVADisk.MatchString(img.File) || img.Disk != "" || !reOVADisk.MatchString(img.Unpack)) {
		return fmt.Errorf("recipe %s: the archive's member %q (a file name of the archive's top directory) is unpacked to %q: both must be disk files (.qcow2, .raw, .vmdk)", o.Recipe.Name, img.Unpack, img.File)
	}
	if o.MaxUnpacked < 0 {
		return fmt.Errorf("max unpacked size %d: want a positive number of bytes", o.MaxUnpacked)
	}
	if o.Timeout < 0 {
		return fmt.Errorf("build timeout %s: want a positive duration", o.Timeout)
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
	o.Mode, _, _ = o.Mode.Normalize()
	return &Builder{px: px, agent: agent, host: host, o: o}, nil
}

// say writes a progress line and logs it.
func (b *Builder) say(step, format string, a ...any) {
	msg := printable(fmt.Sprintf(format, a...))
	b.step.set(step)
	fmt.Fprintf(b.o.Progress, "%-8s %s\n", step+":", msg)
	b.o.Log.Debug(msg, "step", step, "template", b.o.Name)
}

// Run builds the template, or finds the one an earlier run built,
// within Options.Timeout (a *TimeoutError past it).
func (b *Builder) Run(ctx context.Context) (Result, error) {
	ctx, stop := b.withDeadline(ctx)
	defer stop()
	res, err := b.run(ctx)
	return res, timedOut(ctx, err)
}

func (b *Builder) run(ctx context.Context) (Result, error) {
	if res, ok, err := b.find(ctx); err != nil || ok {
		if ok {
			b.say("find", "template %q is VM %d, built earlier and in the hardened profile: reused", b.o.Name, res.VMID)
		}
		return res, err
	}
	if b.o.Mode.ImportOnly && isOVA(b.o.Recipe.Image) {
		// checked before anything is downloaded, as image checks a
		// booted build's OVA
		storage := b.o.ImageStorage
		if v := b.o.Recipe.Image.Volume; v != "" {
			storage, _, _ = strings.Cut(v, ":")
		}
		if err := b.checkWorkStorage(ctx, storage); err != nil {
			return Result{}, err
		}
	}
	src, err := b.image(ctx)
	if err != nil {
		return Result{}, err
	}
	if b.o.Mode.ImportOnly {
		return b.importOnly(ctx, src)
	}
	cicustom, snippets, err := b.seed(ctx)
	if err != nil {
		return Result{}, err
	}
	defer b.removeSnippets(snippets)
	bridge := b.o.Bridge
	if bridge == "" {
		if bridge, err = b.buildNetwork(ctx); err != nil {
			return Result{}, err
		}
	}
	vmid, err := b.create(ctx, src, src.importFrom, b.createConfig(src.importFrom, cicustom, bridge))
	if err != nil {
		return Result{}, err
	}
	rep, err := b.finish(ctx, vmid, src.alg+":"+src.sum)
	if err != nil {
		return Result{VMID: vmid}, b.failed(ctx, vmid, err)
	}
	b.say("done", "template %q is VM %d", b.o.Name, vmid)
	return Result{VMID: vmid, Report: rep}, nil
}

// finish is the build from the created VM to the tagged template; image
// is the digest of the image it was built from (ALG:HEX), for the ledger.
func (b *Builder) finish(ctx context.Context, vmid int, image string) (hardening.Report, error) {
	if err := b.boot(ctx, vmid); err != nil {
		return hardening.Report{}, err
	}
	return b.seal(ctx, vmid, image)
}

// failed destroys a failed build's VM (unless KeepFailed, or
// KeepCancelled and ctx ended: cancelled, or past the build's Timeout)
// and says so.
func (b *Builder) failed(ctx context.Context, vmid int, cause error) error {
	if b.o.KeepFailed || (b.o.KeepCancelled && ctx.Err() != nil) {
		b.say("failed", "VM %d kept (tagged %s: the next build destroys it)", vmid, TagBuilding)
		return cause
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if !b.ours(ctx, vmid) {
		b.say("failed", "VM %d is no longer this build's: left alone", vmid)
		return cause
	}
	if err := b.px.DeleteVM(ctx, vmid); errors.Is(err, sandbox.ErrNotFound) {
		return errors.Join(cause, b.host.Forget(vmid))
	} else if err != nil {
		return errors.Join(cause, fmt.Errorf("destroy the failed build's VM %d (tagged %s: the next build destroys it): %w", vmid, TagBuilding, err))
	}
	b.say("failed", "VM %d destroyed", vmid)
	return errors.Join(cause, b.host.Forget(vmid))
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
// of it, and refuses any other VM of it. A VM is the build's only when
// the ledger records it under the name and it is in no pool (a build's
// create names none); a template is reused only when it also passes the
// hardened profile.
func (b *Builder) find(ctx context.Context) (Result, bool, error) {
	vms, err := b.px.ListVMs(ctx)
	if err != nil {
		return Result{}, false, err
	}
	for _, v := range vms {
		if v.Name != b.o.Name {
			continue
		}
		building := slices.Contains(v.Tags, TagBuilding)
		rec, recorded, err := b.host.Recorded(v.VMID)
		if err != nil {
			return Result{}, false, err
		}
		foreign := func(why string) error {
			return fmt.Errorf("VM %d is named %q and is not this build's (%s; tags %q, template %v, pool %q): pick another name, or remove it (qm destroy %d) to build anew",
				v.VMID, b.o.Name, why, strings.Join(v.Tags, ";"), v.Template, v.Pool, v.VMID)
		}
		switch {
		case v.Pool != "":
			return Result{}, false, foreign("it is in a pool")
		case !recorded || rec.Name != b.o.Name:
			return Result{}, false, foreign("no build on this node recorded it")
		case v.Template && !building && hasAll(v.Tags, b.wantTags()) && rec.State == StateTemplate:
			conf, err := b.px.VMConfig(ctx, v.VMID)
			if err != nil {
				return Result{}, false, err
			}
			rep := hardening.CheckTemplate(conf)
			if f := rep.TemplateFailures(); len(f) > 0 {
				return Result{}, false, fmt.Errorf("template %d, built earlier, is no longer in the hardened profile (%v): remove it (qm destroy %d) to build anew, or harden it (pve-inspectd template harden %d)", v.VMID, f, v.VMID, v.VMID)
			}
			if rec.Mode != b.o.Mode {
				return Result{}, false, fmt.Errorf("template %q (VM %d) exists, %s, not %s as asked: remove it (qm destroy %d) to build it anew, or name this build another", b.o.Name, v.VMID, rec.Mode, b.o.Mode, v.VMID)
			}
			if err := UEFIAllowed(b.o.Name, v.VMID, rep, b.o.AllowUEFI); err != nil {
				return Result{}, false, err
			}
			return Result{VMID: v.VMID, Reused: true, Report: rep}, true, nil
		case !building:
			return Result{}, false, foreign("not the state the build recorded")
		}
		b.say("find", "VM %d is a half-built %q from an earlier run: destroying it", v.VMID, b.o.Name)
		if err := b.px.DeleteVM(ctx, v.VMID); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			return Result{}, false, fmt.Errorf("destroy half-built VM %d: %w", v.VMID, err)
		}
		if err := b.host.Forget(v.VMID); err != nil {
			return Result{}, false, err
		}
	}
	return Result{}, false, nil
}

// UEFIAllowed refuses to reuse the template vmid (name), built earlier,
// whose profile check rep says it boots UEFI firmware (bios ovmf: an
// OVA imported without boot whose OVF asked for EFI) on a node whose
// [api] allow_uefi is off (allow false): every create there refuses it
// (sandbox checkVMOptionsAllowed), so reporting it reused would defer the
// refusal to each sample. The option may have been turned off since the
// build. The error wraps ErrBuildConflict.
func UEFIAllowed(name string, vmid int, rep hardening.Report, allow bool) error {
	if !rep.UEFI || allow {
		return nil
	}
	return fmt.Errorf("%w: template %q (VM %d), built earlier, boots UEFI firmware (bios ovmf) and this node's [api] allow_uefi is off: every create here would refuse it (its clones boot OVMF, whose SMM emulation and pflash device allow_uefi keeps out); set [api] allow_uefi = true in the daemon's config, or remove the template (qm destroy %d)",
		ErrBuildConflict, name, vmid, vmid)
}

// Existing finds, without changing anything, the finished template named
// name that a build of recipe ("" for a build from an image alone) would
// reuse: its id, its profile check, and whether there is one. It takes what find takes and
// nothing else: a template in no pool that a build on this node recorded
// as a template of this name (host's ledger), carrying the build's tags,
// and still in the hardened profile; a template of the name another user
// made and tagged is not one (it is never reused, nor granted to the
// daemon's token).
func Existing(ctx context.Context, px interface {
	ListVMs(ctx context.Context) ([]sandbox.VMInfo, error)
	VMConfig(ctx context.Context, vmid int) (map[string]string, error)
}, host interface {
	Recorded(vmid int) (Record, bool, error)
}, name, recipe string) (int, hardening.Report, bool, error) {
	vms, err := px.ListVMs(ctx)
	if err != nil {
		return 0, hardening.Report{}, false, err
	}
	want := (&Builder{o: Options{Recipe: Recipe{Name: recipe}}}).wantTags()
	for _, v := range vms {
		if v.Name != name {
			continue
		}
		if _, ok, err := ledgerTemplate(host, v, want); err != nil {
			return 0, hardening.Report{}, false, err
		} else if !ok {
			continue
		}
		conf, err := px.VMConfig(ctx, v.VMID)
		if err != nil {
			return 0, hardening.Report{}, false, err
		}
		rep := hardening.CheckTemplate(conf)
		if len(rep.TemplateFailures()) > 0 {
			continue
		}
		return v.VMID, rep, true, nil
	}
	return 0, hardening.Report{}, false, nil
}

func hasAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// source is the image a create imports: its import-from volume, and
// the file's path on the node with the digest it had when the build took
// it, hashed again after the import (a file replaced meanwhile, by an
// upload of a user with Datastore.AllocateTemplate, is caught).
type source struct {
	importFrom string
	path       string
	alg, sum   string
}

// BuildFile is the file a build downloads url to: a name of this
// project's (pvei-), with the first 16 hex digits of the image's digest
// (of the URL when no digest is known), so that an image the
// distribution republishes under the same name is a new file and no
// file another user put on the storage under the URL's name is taken.
func BuildFile(url, file, sum string) string {
	if sum == "" {
		h := sha256.Sum256([]byte(url))
		sum = "u" + hex.EncodeToString(h[:])
	}
	return "pvei-" + sum[:16] + "-" + file
}

// image makes sure the image is on the node and returns it.
func (b *Builder) image(ctx context.Context) (source, error) {
	img := b.o.Recipe.Image
	storage := b.o.ImageStorage
	if img.Volume != "" {
		storage, _, _ = strings.Cut(img.Volume, ":")
	} else if img.Unpack != "" {
		return b.unpacked(ctx, storage)
	}
	if img.Disk != "" {
		if err := b.checkWorkStorage(ctx, storage); err != nil {
			return source{}, err
		}
	}
	alg, sum, err := b.checksum(ctx)
	if err != nil {
		return source{}, err
	}
	volid := img.Volume
	if volid == "" {
		volid = storage + ":import/" + BuildFile(img.URL, img.File, sum)
	}
	src := source{importFrom: volid, alg: alg, sum: sum}
	if img.Disk != "" {
		src.importFrom += "/" + img.Disk
	}
	vols, err := b.px.StorageVolumes(ctx, storage, "import")
	if err != nil {
		return source{}, err
	}
	present := slices.ContainsFunc(vols, func(v pveapi.StorageVolume) bool { return v.VolID == volid })
	switch {
	case img.URL == "" && !present:
		return source{}, fmt.Errorf("volume %s is not on storage %s (upload the image to its import directory first)", volid, storage)
	case img.URL == "":
		// The operator's own volume, or an upload's: its digest now
		// (the one given, when given), checked again after the import.
		if src.alg == "" {
			src.alg = "sha256"
		}
		return b.hashed(ctx, volid, src, sum)
	case present && sum == "":
		// download-url itself refuses to override an existing file
		// without a checksum (PVE::Tools download_file_from_url).
		return source{}, fmt.Errorf("%s is already on the node and there is no checksum to verify it: pass --checksum, or remove it (pvesm free %s) to download it again", volid, volid)
	case present:
		return b.hashed(ctx, volid, src, sum)
	}
	if sum == "" {
		b.say("image", "downloading %s to %s (no checksum: not verified)", RedactURL(img.URL), volid)
	} else {
		b.say("image", "downloading %s to %s (Proxmox verifies its %s)", RedactURL(img.URL), volid, alg)
	}
	_, file, _ := strings.Cut(volid, ":import/")
	if _, err := b.px.DownloadURL(ctx, storage, pveapi.Download{URL: img.URL, Content: "import", Filename: file, Checksum: sum, ChecksumAlgorithm: alg}); err != nil {
		b.stopDownload(ctx, volid, err)
		return source{}, err
	}
	if sum == "" {
		src.alg = "sha256"
	}
	return b.hashed(ctx, volid, src, sum)
}

// stopDownload stops the download-url task of volid when err says the
// build stopped waiting for it before it ended (a cancel, the build's
// Timeout, a wait that failed): else Proxmox's wget goes on downloading
// an image no one waits for. The worker, stopped, removes its temporary
// file (pve-common Tools.pm download_file_from_url); a task that finished
// first leaves volid whole, which the next build checks against its
// digest and keeps. A failure to stop is logged: the build's error stays
// err.
func (b *Builder) stopDownload(ctx context.Context, volid string, err error) {
	var tu *pveapi.TaskUnfinishedError
	if !errors.As(err, &tu) {
		return
	}
	if serr := b.px.StopTask(ctx, tu.UPID); serr != nil {
		b.o.Log.Warn("the build's download task may still run", "template", b.o.Name, "volume", volid, "upid", tu.UPID, "err", serr)
		b.say("image", "could not stop Proxmox's download task %s (it may go on downloading %s): %v", tu.UPID, volid, serr)
		return
	}
	b.say("image", "stopped Proxmox's download task %s (a file it had finished is kept for the next build)", tu.UPID)
}

// hashed hashes volid's file into src; want, when set, is the digest it
// must have.
func (b *Builder) hashed(ctx context.Context, volid string, src source, want string) (source, error) {
	p, err := b.px.VolumePath(ctx, volid)
	if err != nil {
		return source{}, err
	}
	got, err := b.host.Checksum(p, src.alg)
	if err != nil {
		return source{}, fmt.Errorf("checksum of %s: %w", p, err)
	}
	if want != "" && got != want {
		return source{}, fmt.Errorf("%s has %s %s, want %s: it is not the image (replaced on the storage?): remove it (pvesm free %s) and build again", volid, src.alg, got, want, volid)
	}
	src.path, src.sum = p, got
	b.say("image", "%s: %s %s (checked again after the import)", volid, src.alg, got)
	return src, nil
}

// recheck hashes the image again after the create imported it: a file
// replaced between the check and the import fails the build.
func (b *Builder) recheck(src source) error {
	got, err := b.host.Checksum(src.path, src.alg)
	if err != nil {
		return fmt.Errorf("checksum of %s after the import: %w", src.path, err)
	}
	if got != src.sum {
		return fmt.Errorf("the image %s changed while it was imported (%s %s, was %s): not built from it", src.path, src.alg, got, src.sum)
	}
	return nil
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
	sum, err = findChecksum(list, img.Listed(), checksumLen[img.ChecksumAlg])
	if err != nil {
		return "", "", fmt.Errorf("checksum list %s: %w", img.ChecksumURL, err)
	}
	b.say("image", "%s of %s from %s", img.ChecksumAlg, img.Listed(), img.ChecksumURL)
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
func (b *Builder) createConfig(importFrom, cicustom, bridge string) map[string]string {
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
	conf["net0"] = "virtio,bridge=" + bridge
	if b.o.WorkStorage != "" && b.o.Recipe.Image.Disk != "" {
		conf["import-working-storage"] = b.o.WorkStorage
	}
	return conf
}

// create makes the build VM of configuration conf (tagged building; its
// disks imported from), checks the image again and grows its disk. An id
// another client took between NextID and the create is given up for the
// next one (three tries); a create that failed otherwise is cleaned up
// only when the VM of the id is this build's.
func (b *Builder) create(ctx context.Context, src source, from string, conf map[string]string) (int, error) {
	var vmid int
	for try := 1; ; try++ {
		var err error
		if vmid, err = b.px.NextID(ctx); err != nil {
			return 0, err
		}
		b.say("create", "VM %d %q from %s", vmid, b.o.Name, from)
		// Recorded before the create: a build killed during the import
		// leaves a VM the next build knows as its own.
		if err := b.host.Record(vmid, Record{Name: b.o.Name, State: StateBuilding}); err != nil {
			return 0, fmt.Errorf("record VM %d in the build ledger: %w", vmid, err)
		}
		err = b.px.CreateVM(ctx, vmid, conf)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			// The build ended (cancelled, or its Timeout) while it
			// waited for the create's task, which goes on: qemu-server
			// locked the VM's config before its worker, and the worker
			// writes the whole config (name, tags) only after its
			// import (API2/Qemu.pm create_vm: create_and_lock_config,
			// create_disks, write_config). The record stays, so that
			// the VM the task makes is the next build's to destroy
			// (find) and not a VM of the name no build recorded.
			b.say("create", "VM %d: the build ended while Proxmox's create task ran; the task may still make the VM, which the next build of %q destroys", vmid, b.o.Name)
			return 0, err
		}
		if b.ours(ctx, vmid) {
			return 0, b.failed(ctx, vmid, err)
		}
		if ferr := b.host.Forget(vmid); ferr != nil {
			return 0, errors.Join(err, ferr)
		}
		if errors.Is(err, sandbox.ErrExists) && try < 3 {
			b.say("create", "VM %d was taken meanwhile: taking the next id", vmid)
			continue
		}
		return 0, err
	}
	if err := b.recheck(src); err != nil {
		return 0, b.failed(ctx, vmid, err)
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

// ours reports whether VM vmid exists as this build's: its name, the
// building tag, in no pool, and the ledger's record of it as building
// under the name (a create that failed in its task may leave its config).
func (b *Builder) ours(ctx context.Context, vmid int) bool {
	conf, err := b.px.VMConfig(ctx, vmid)
	if err != nil || conf["name"] != b.o.Name || !slices.Contains(strings.Split(conf["tags"], ";"), TagBuilding) || b.inPool(ctx, vmid) {
		return false
	}
	rec, ok, err := b.host.Recorded(vmid)
	return err == nil && ok && rec.Name == b.o.Name && rec.State == StateBuilding
}

// inPool reports whether vmid is in a pool (true when the list fails).
func (b *Builder) inPool(ctx context.Context, vmid int) bool {
	vms, err := b.px.ListVMs(ctx)
	if err != nil {
		return true
	}
	i := slices.IndexFunc(vms, func(v sandbox.VMInfo) bool { return v.VMID == vmid })
	return i < 0 || vms[i].Pool != ""
}

// stillOurs fails when VM vmid is no longer this build's (ours).
func (b *Builder) stillOurs(ctx context.Context, vmid int, step string) error {
	if !b.ours(ctx, vmid) {
		return fmt.Errorf("%s: VM %d is no longer this build's (its name, the %s tag, no pool and the build ledger's record): stopped", step, vmid, TagBuilding)
	}
	return nil
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
