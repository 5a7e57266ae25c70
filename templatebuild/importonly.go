package templatebuild

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// An import-only build (Mode.ImportOnly) makes a template of an image as
// it is, the reference plugin's OVA import: the VM is created with every
// disk of the image imported (for an OVA, each disk its OVF lists, as
// Proxmox's import-metadata reads them) on the bus the mode names, the
// mode's ostype and the hardened profile's settings, no cloud-init drive
// and no NIC; it is never started, so nothing runs in the guest: no
// guest agent is installed, no machine id, SSH host key or lease is
// reset, and every clone starts as the image does. The profile is then
// checked and the VM converted, tagged and recorded like a booted build.
// Used for images whose system cannot or must not be changed: a
// VulnHub-style victim without cloud-init or agent, or an image that has
// its agent already.

// Disk buses an import-only build puts the image's disks on.
const (
	// BusSCSI is virtio-scsi (scsihw virtio-scsi-single): the default,
	// the bus of the hardened profile's scsi item.
	BusSCSI = "scsi"
	// BusIDE and BusSATA are emulated ATA, for old images without
	// virtio drivers: on q35 ide disks on the ICH9 AHCI controller every
	// q35 VM has, sata disks on one more AHCI controller (the same QEMU
	// device model) qemu-server adds for them (QemuServer.pm
	// config_to_command's -device ahci).
	BusIDE  = "ide"
	BusSATA = "sata"
)

// busDisks is how many disks each bus takes: qemu-server Drive.pm
// $MAX_SCSI_DISKS (31), $MAX_IDE_DISKS (4), $MAX_SATA_DISKS (6), the
// slots its confdesc defines (scsi0-scsi30, ide0-ide3, sata0-sata5).
var busDisks = map[string]int{BusSCSI: 31, BusIDE: 4, BusSATA: 6}

// Mode is how a build makes its template from the image, part of the
// build's identity beside the image: a template built one way is never
// taken for a request of another (find, Service). The zero Mode is the
// booted build (cloud-init, the guest agent, the seal in the guest).
type Mode struct {
	// ImportOnly imports the image's disks without booting it.
	ImportOnly bool `json:"import_only,omitempty"`
	// DiskBus is the bus of every imported disk (BusSCSI, BusIDE,
	// BusSATA); OSType the VM's ostype (hardening.OSTypes). Set only
	// with ImportOnly (Normalize fills their defaults).
	DiskBus string `json:"disk_bus,omitempty"`
	OSType  string `json:"os_type,omitempty"`
}

// Normalize checks m and fills an import-only mode's defaults (scsi,
// l26), so that two requests of one mode compare equal. The error names
// the field (disk_bus, os_type) and the values it takes.
func (m Mode) Normalize() (Mode, string, error) {
	if !m.ImportOnly {
		switch {
		case m.DiskBus != "":
			return m, "disk_bus", fmt.Errorf("%q: a disk bus goes with an import-only build (a booted build's disk is on virtio-scsi)", m.DiskBus)
		case m.OSType != "":
			return m, "os_type", fmt.Errorf("%q: an OS type goes with an import-only build (a booted build makes a Linux template, l26)", m.OSType)
		}
		return m, "", nil
	}
	if m.DiskBus == "" {
		m.DiskBus = BusSCSI
	}
	if m.OSType == "" {
		m.OSType = hardening.OSLinux
	}
	if busDisks[m.DiskBus] == 0 {
		return m, "disk_bus", fmt.Errorf("%q: want scsi (virtio-scsi, the default), ide or sata", m.DiskBus)
	}
	if !slices.Contains(hardening.OSTypes, m.OSType) {
		return m, "os_type", fmt.Errorf("%q: want one of %s (the hardened profile's)", m.OSType, strings.Join(hardening.OSTypes, ", "))
	}
	return m, "", nil
}

// String says the mode in a progress line or an error.
func (m Mode) String() string {
	if !m.ImportOnly {
		return "booted (cloud-init, the guest agent, sealed in the guest)"
	}
	return fmt.Sprintf("imported without boot (disks on %s, ostype %s)", m.DiskBus, m.OSType)
}

// ImportVolume is the image for --from STORAGE:import/FILE with
// --import-only: a file in a storage's import directory, an .ova named
// whole (every disk of it is imported) or an image of one disk.
func ImportVolume(volid string) (Image, error) {
	storage, name, ok := strings.Cut(volid, ":")
	file, isImport := strings.CutPrefix(name, "import/")
	if !ok || !reStorageID.MatchString(storage) || !isImport || !reImportFile.MatchString(file) {
		return Image{}, fmt.Errorf("--from %q: an import-only build takes a volume STORAGE:import/FILE (.ova, .qcow2, .raw, .vmdk; an OVA whole: every disk of it is imported)", volid)
	}
	return Image{Volume: storage + ":import/" + file, File: file}, nil
}

// uploadMode is an upload's mode, normalized: a bad disk_bus or os_type,
// or an ova_disk with import_only, is refused naming the field.
func uploadMode(u apitype.TemplateUpload) (Mode, error) {
	m, field, err := Mode(u.BuildMode).Normalize()
	if err != nil {
		return Mode{}, invalidField(field, err)
	}
	if m.ImportOnly && u.OVADisk != "" {
		return Mode{}, badRequest("ova_disk", "import_only imports every disk of the OVA (Proxmox's import-metadata lists them): give no ova_disk")
	}
	return m, nil
}

// isOVA reports whether the image is an OVA archive (named whole).
func isOVA(img Image) bool { return strings.HasSuffix(img.File, ".ova") }

// validateImport checks the options of an import-only build.
func (o Options) validateImport() error {
	if _, field, err := o.Mode.Normalize(); err != nil {
		return fmt.Errorf("--%s: %w", strings.ReplaceAll(field, "_", "-"), err)
	}
	if !o.Mode.ImportOnly {
		if isOVA(o.Recipe.Image) && o.Recipe.Image.Disk == "" {
			return fmt.Errorf("%s: a booted build of an OVA names its disk (STORAGE:import/FILE.ova/DISK.vmdk, --ova-disk); --import-only imports every disk", o.Recipe.Image.File)
		}
		return nil
	}
	if o.Recipe.Name != "" {
		return fmt.Errorf("recipe %s: a recipe's packages and checks need the image booted; --import-only builds from --from alone", o.Recipe.Name)
	}
	if o.Recipe.Image.Disk != "" {
		return fmt.Errorf("--import-only imports every disk of the OVA (Proxmox's import-metadata lists them): name the OVA whole (STORAGE:import/FILE.ova), not its disk %s", o.Recipe.Image.Disk)
	}
	return nil
}

// importOnly is Run's import-only build from the image src on the node:
// the disks, the VM (never started), the template.
func (b *Builder) importOnly(ctx context.Context, src source) (Result, error) {
	g, err := b.importGuest(ctx, src)
	if err != nil {
		return Result{}, err
	}
	b.say("import", "%d disk(s) on %s, ostype %s, no cloud-init drive, no NIC: the image is imported without boot (no guest agent installed, nothing reset in the guest)",
		len(g.disks), b.o.Mode.DiskBus, b.o.Mode.OSType)
	vmid, err := b.create(ctx, src, strings.Join(g.disks, ", "), b.importConfig(g))
	if err != nil {
		return Result{}, err
	}
	if err := b.stillOurs(ctx, vmid, "seal"); err != nil {
		return Result{VMID: vmid}, b.failed(ctx, vmid, err)
	}
	rep, err := b.toTemplate(ctx, vmid, src.alg+":"+src.sum)
	if err != nil {
		return Result{VMID: vmid}, b.failed(ctx, vmid, err)
	}
	b.say("done", "template %q is VM %d, imported without boot", b.o.Name, vmid)
	return Result{VMID: vmid, Report: rep}, nil
}

// importedGuest is what an import-only build makes of its image: the
// import-from sources of its disks in boot order, and, for an OVA, what
// Proxmox's import-metadata says of the guest: its firmware and its size
// (0: the recipe's).
type importedGuest struct {
	disks []string
	// uefi: the OVF asks for EFI firmware (import-metadata's bios ovmf,
	// disks.efidisk0).
	uefi bool
	// memoryMiB and cores are the OVF's, within the API's bounds.
	memoryMiB, cores int
}

// importGuest is the guest of the image src: its disks, and for an OVA
// its firmware and size as Proxmox's import-metadata reads the OVF
// (create-args).
func (b *Builder) importGuest(ctx context.Context, src source) (importedGuest, error) {
	if !isOVA(b.o.Recipe.Image) {
		return importedGuest{disks: []string{src.importFrom}}, nil
	}
	md, err := b.px.ImportMetadata(ctx, src.importFrom)
	if err != nil {
		return importedGuest{}, fmt.Errorf("the disks of %s (Proxmox's import-metadata): %w", src.importFrom, err)
	}
	disks, err := b.importSources(src, md)
	if err != nil {
		return importedGuest{}, err
	}
	g := importedGuest{disks: disks, uefi: md.EFI || md.CreateArgs["bios"] == "ovmf"}
	if g.uefi && !b.o.AllowUEFI {
		return importedGuest{}, fmt.Errorf("%s: the OVF asks for UEFI firmware (bios ovmf) and this node's [api] allow_uefi is off: every create would refuse the template (its clones boot OVMF, whose SMM emulation and pflash device allow_uefi keeps out); nothing was created: set [api] allow_uefi = true in the daemon's config to build it", src.importFrom)
	}
	if g.uefi {
		b.say("import", "the OVF asks for UEFI firmware: bios ovmf with a new EFI vars disk (%s; the OVA carries no EFI variables, Proxmox's efi-state-lost: the guest boots by its firmware's default path); its clones are VMs created with firmware uefi, on a node with [api] allow_uefi",
			hardening.NewEFIDisk(b.o.Storage))
	}
	var said []string
	for _, sz := range []struct {
		key, unit string
		lo, hi    int
		to        *int
	}{{"memory", " MiB", apitype.MinVMMemoryMiB, apitype.MaxVMMemoryMiB, &g.memoryMiB}, {"cores", "", apitype.MinVMCores, apitype.MaxVMCores, &g.cores}} {
		n, ok, bounded := ovfSize(md.CreateArgs[sz.key], sz.lo, sz.hi)
		if !ok {
			continue
		}
		*sz.to = n
		w := fmt.Sprintf("%s %d%s", sz.key, n, sz.unit)
		if bounded {
			w += fmt.Sprintf(" (the OVF's %q, bounded to %d..%d)", md.CreateArgs[sz.key], sz.lo, sz.hi)
		}
		said = append(said, w)
	}
	if len(said) > 0 {
		b.say("import", "%s, as the OVF says (its clones set their own)", strings.Join(said, ", "))
	}
	return g, nil
}

// ovfSize reads a size of import-metadata's create-args (the OVF's
// VirtualQuantity as Proxmox reads it, text; memory in MiB, its
// AllocationUnits unread, as Proxmox's import takes it): a whole number,
// bounded to lo..hi (bounded says it was outside); ok is false for one
// the OVF does not give, or not as a whole number (the recipe's stays).
func ovfSize(v string, lo, hi int) (n int, ok, bounded bool) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return 0, false, false
	}
	c := clamp(n, lo, hi)
	return c, true, c != n
}

func clamp(n, lo, hi int) int { return max(lo, min(n, hi)) }

// reOVAMember is an OVA member an import takes: a file name (no
// directory, no white space) of a disk image (pve-storage Storage.pm
// $OVA_CONTENT_RE_1 without its white space).
var reOVAMember = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.+=-]*\.(qcow2|raw|vmdk)$`)

// importSources are the import-from sources of the disks of the OVA
// src, in boot order: each disk Proxmox's import-metadata md lists, in
// the order of the OVF (its boot order).
func (b *Builder) importSources(src source, md pveapi.ImportMetadata) ([]string, error) {
	keys, err := ovaDiskOrder(md)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src.importFrom, err)
	}
	if max := busDisks[b.o.Mode.DiskBus]; len(keys) > max {
		return nil, fmt.Errorf("%s holds %d disks and %s takes %d (qemu-server's slots %s0-%s%d): pick a bus that takes them (scsi takes 31)",
			src.importFrom, len(keys), b.o.Mode.DiskBus, max, b.o.Mode.DiskBus, b.o.Mode.DiskBus, max-1)
	}
	var out []string
	for _, k := range keys {
		d := md.Disks[k]
		member, ok := strings.CutPrefix(d.VolID, src.importFrom+"/")
		if !ok || !reOVAMember.MatchString(member) {
			return nil, fmt.Errorf("%s: its OVF's disk %s is %q, not a disk image of the archive this build takes (a file name of letters, digits and '_.+=-' ending .vmdk, .qcow2 or .raw)",
				src.importFrom, k, d.VolID)
		}
		b.say("import", "disk %s of the OVF: %s (%s)", k, d.VolID, ovfSizeText(d.Size))
		out = append(out, d.VolID)
	}
	return out, nil
}

// ovaDiskOrder orders the disks import-metadata lists: as the OVF's boot
// order (create-args boot, "order=" the disks' keys in the OVF's order),
// then any other by bus and number. An OVA whose OVF lists no disk or
// two disks at one key (import-metadata keeps one of them) is refused.
func ovaDiskOrder(md pveapi.ImportMetadata) ([]string, error) {
	if len(md.Disks) == 0 {
		return nil, fmt.Errorf("its OVF lists no disk Proxmox can import")
	}
	var keys []string
	order, _ := strings.CutPrefix(md.CreateArgs["boot"], "order=")
	for _, k := range strings.Split(order, ";") {
		if _, ok := md.Disks[k]; !ok {
			continue
		}
		if slices.Contains(keys, k) {
			return nil, fmt.Errorf("its OVF puts two disks at %s, and Proxmox's import-metadata lists one of them: fix the OVF's AddressOnParent", k)
		}
		keys = append(keys, k)
	}
	var rest []string
	for k := range md.Disks {
		if !slices.Contains(keys, k) {
			rest = append(rest, k)
		}
	}
	slices.SortFunc(rest, func(a, b string) int {
		ba, na := splitKey(a)
		bb, nb := splitKey(b)
		if c := strings.Compare(ba, bb); c != 0 {
			return c
		}
		return na - nb
	})
	return append(keys, rest...), nil
}

// splitKey splits a disk key (scsi1) into its bus and number.
func splitKey(k string) (string, int) {
	i := strings.IndexAny(k, "0123456789")
	if i < 0 {
		return k, -1
	}
	n, _ := strconv.Atoi(k[i:])
	return k[:i], n
}

func ovfSizeText(n int64) string {
	if n <= 0 {
		return "size not in the OVF"
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

// importConfig is an import-only build's VM of guest g: the hardened
// profile's settings for the mode's ostype (a Windows type's machine
// pinned, as hardening.CloneChangesFor pins it) and the guest's firmware
// (a UEFI guest: bios ovmf and a new EFI vars disk, as a create asking
// firmware uefi gets, hardening.NewEFIDisk), each disk imported on the
// mode's bus in order (the first boots), the OVF's memory and cores (else
// the recipe's), no cloud-init drive, no NIC.
func (b *Builder) importConfig(g importedGuest) map[string]string {
	want := hardening.Want{OSType: b.o.Mode.OSType}
	if g.uefi {
		want.Firmware = hardening.FirmwareUEFI
	}
	conf, _ := hardening.CloneChangesFor(map[string]string{}, want)
	r := b.o.Recipe
	conf["name"] = b.o.Name
	conf["tags"] = TagBuilding
	conf["memory"] = fmt.Sprint(max(r.MemoryMiB, 512))
	conf["cores"] = fmt.Sprint(max(r.Cores, 1))
	if g.memoryMiB > 0 {
		conf["memory"] = fmt.Sprint(g.memoryMiB)
	}
	if g.cores > 0 {
		conf["cores"] = fmt.Sprint(g.cores)
	}
	conf["scsihw"] = hardening.SCSIHW
	conf["ostype"] = b.o.Mode.OSType
	for i, d := range g.disks {
		conf[fmt.Sprintf("%s%d", b.o.Mode.DiskBus, i)] = b.o.Storage + ":0,import-from=" + d
	}
	conf["boot"] = "order=" + b.o.Mode.DiskBus + "0"
	if g.uefi {
		conf["bios"] = "ovmf"
		conf["efidisk0"] = hardening.NewEFIDisk(b.o.Storage)
	}
	if b.o.WorkStorage != "" && isOVA(r.Image) {
		conf["import-working-storage"] = b.o.WorkStorage
	}
	return conf
}
