package templatebuild_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/templatebuild"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// victimOVA is a VulnHub-style OVA (the reference plugin's ctf4 victim):
// its OVF lists n disks on an IDE controller (OVF.pm's ide0, ide1, ...),
// 8 GiB and then 1 GiB each; its system has no cloud-init and no agent.
func victimOVA(t *testing.T, n int) []byte {
	t.Helper()
	var disks []pveemu.OVFDisk
	members := []any{}
	for i := range n {
		d := pveemu.OVFDisk{File: fmt.Sprintf("ctf4-disk%d.vmdk", i+1), Size: 1 << 30}
		if i == 0 {
			d.Size = 8 << 30
		}
		disks = append(disks, d)
		members = append(members, d.File, vmdkHeader(d.Size))
	}
	ovf := pveemu.OVFDescriptor("ctf4", 96, "ide", disks...)
	return tarOf(t, append([]any{"ctf4.ovf", []byte(ovf)}, members...)...)
}

// importNode is a service node whose local storage takes an OVA's
// extraction and whose agent never answers (gate shut: a build that
// asked it would hang until AgentWait), and an upload of ova as name
// imported without boot on disk bus bus.
func importNode(t *testing.T, ova []byte, name, bus string) (*serviceNode, apitype.TemplateUpload) {
	t.Helper()
	return importNodeWith(t, ova, name, bus, nil)
}

// importNodeWith is importNode with the service's options changed by mod
// first.
func importNodeWith(t *testing.T, ova []byte, name, bus string, mod func(*templatebuild.ServiceOptions)) (*serviceNode, apitype.TemplateUpload) {
	t.Helper()
	n := newServiceNodeWith(t, mod)
	n.s.SetStorageContent("local", "backup,iso,vztmpl,import,snippets,images")
	h := sha256.Sum256(ova)
	return n, apitype.TemplateUpload{Name: name, File: "ctf4.ova", SHA256: hex.EncodeToString(h[:]), Size: int64(len(ova)),
		BuildMode: apitype.BuildMode{ImportOnly: true, DiskBus: bus}}
}

// started reports whether the emulator was asked to start VM vmid.
func (e emuNode) started(vmid int) bool {
	return slices.ContainsFunc(e.s.Requests(), func(r pveemu.RequestRecord) bool {
		return r.Path == fmt.Sprintf("/nodes/pve/qemu/%d/status/start", vmid)
	})
}

// created is the parameters of the create of VM vmid the emulator
// answered.
func (e emuNode) created(vmid int) map[string]any {
	for _, r := range e.s.Requests() {
		if r.Method == "POST" && r.Path == "/nodes/pve/qemu" && fmt.Sprint(r.Params["vmid"]) == fmt.Sprint(vmid) && r.Status == 200 {
			return r.Params
		}
	}
	return nil
}

// TestImportOnlyTwoDiskOVAOnIDE: the reference's ctf4 victim (an OVA of
// two disks, no cloud-init, no agent) uploaded for a build without boot
// on ide: both disks the OVF lists (Proxmox's import-metadata) are
// imported on ide0 and ide1 in the OVF's order, the VM is never started
// (no agent is asked, no build network made), the template carries no
// cloud-init drive and no NIC, passes the hardened profile's check with
// its disks on ide, and is tagged, recorded with the image's digest and
// the mode, and said "imported without boot"; a second upload reuses it
// unread, and a daemon started since reports its mode.
func TestImportOnlyTwoDiskOVAOnIDE(t *testing.T) {
	ova := victimOVA(t, 2)
	n, u := importNode(t, ova, "victim", "ide")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := n.svc.Upload(ctx, u, bodyOf(bytes.NewReader(ova)))
	if err != nil || !st.ImportOnly || st.DiskBus != "ide" || st.OSType != "l26" {
		t.Fatalf("upload: %+v %v, want the mode normalized (ide, l26)", st, err)
	}
	done := n.waitState(t, "victim", apitype.BuildDone)
	if done.Image != "sha256:"+u.SHA256 || done.BuildMode != (apitype.BuildMode{ImportOnly: true, DiskBus: "ide", OSType: "l26"}) {
		t.Errorf("done build %+v: want its image and mode", done)
	}
	out := strings.Join(done.Progress, "\n")
	stored := "local:import/" + templatebuild.UploadFile("ctf4.ova", u.SHA256)
	for _, want := range []string{"disk ide0 of the OVF: " + stored + "/ctf4-disk1.vmdk (8.0 GiB)", "disk ide1 of the OVF: " + stored + "/ctf4-disk2.vmdk (1.0 GiB)",
		"2 disk(s) on ide, ostype l26", "imported without boot", "tagged inspect;pvei-template"} {
		if !strings.Contains(out, want) {
			t.Errorf("progress lacks %q:\n%s", want, out)
		}
	}
	for _, not := range []string{"boot:", "agent:", "cloud-init:", "seed:", "network:", "check:", "prepare:"} {
		if strings.Contains(out, not) {
			t.Errorf("progress of a build without boot has %q:\n%s", not, out)
		}
	}
	select {
	case <-n.agent.asked:
		t.Error("the guest agent was asked")
	default:
	}
	if n.started(done.VMID) {
		t.Error("the VM was started")
	}
	create := n.created(done.VMID)
	if create == nil || create["ide0"] == nil || create["ide1"] == nil {
		t.Errorf("create %v: want ide0 and ide1 imported", create)
	}
	for _, k := range []string{"net0", "ide2", "cicustom", "scsi0"} {
		if v, ok := create[k]; ok {
			t.Errorf("the VM was created with %s=%v (a NIC, a cloud-init drive, or a disk off the bus asked)", k, v)
		}
	}
	conf, err := n.px.VMConfig(ctx, done.VMID)
	if err != nil {
		t.Fatal(err)
	}
	if conf["template"] != "1" || conf["tags"] != "inspect;pvei-template" || conf["ostype"] != "l26" || conf["boot"] != "order=ide0" ||
		!strings.HasPrefix(conf["ide0"], "local-lvm:base-") || !strings.HasSuffix(conf["ide0"], "size=8G") || !strings.HasSuffix(conf["ide1"], "size=1G") {
		t.Errorf("template config %v", conf)
	}
	for _, k := range []string{"scsi0", "ide2", "cicustom", "net0"} {
		if v, ok := conf[k]; ok {
			t.Errorf("template has %s=%s", k, v)
		}
	}
	if rep := hardening.Check(conf); !rep.OK() {
		t.Errorf("the imported template fails the profile: %v", rep.Failed())
	}
	rec, ok, err := templatebuild.NodeHost{StateDir: n.ledger}.Recorded(done.VMID)
	if err != nil || !ok || rec.Image != "sha256:"+u.SHA256 || rec.Mode != (templatebuild.Mode{ImportOnly: true, DiskBus: "ide", OSType: "l26"}) {
		t.Errorf("ledger %+v %v %v", rec, ok, err)
	}
	if evs := n.ev.wait(t, apitype.EventTemplateBuildDone, 1); len(evs) != 1 || !strings.HasSuffix(evs[0].Detail, "imported without boot") {
		t.Errorf("done events %+v", evs)
	}

	body := &readCounter{r: bytes.NewReader(ova)}
	again, err := n.svc.Upload(ctx, u, bodyOf(body))
	if err != nil || again.State != apitype.BuildDone || !again.Reused || again.VMID != done.VMID || body.n != 0 || !again.ImportOnly {
		t.Errorf("the same upload again: %+v %v (read %d), want reused unread", again, err, body.n)
	}
	fresh, err := templatebuild.NewService(templatebuild.ServiceOptions{
		Login: func(context.Context) (templatebuild.Proxmox, error) { return n.px, nil },
		Agent: n.agent, Host: templatebuild.NodeHost{StateDir: n.ledger},
		Defaults: templatebuild.Options{Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local", Bridge: "bzv0"},
		LockDir:  t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, ok, err := fresh.Template(ctx, "victim"); err != nil || !ok || got.BuildMode != done.BuildMode || got.Image != done.Image {
		t.Errorf("template after a restart: %+v %v %v, want its mode and image", got, ok, err)
	}
}

// TestImportOnlyRefusals: a bad disk_bus or os_type, one without
// import_only, or an ova_disk with it is refused naming the field before
// the body is read or anything changes; an OVA of more disks than its bus
// takes (ide: 4) fails its build, leaving no VM.
func TestImportOnlyRefusals(t *testing.T) {
	ova := victimOVA(t, 5)
	n, u := importNode(t, ova, "five", "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tt := range []struct {
		field string
		edit  func(*apitype.TemplateUpload)
	}{
		{"disk_bus", func(u *apitype.TemplateUpload) { u.DiskBus = "virtio" }},
		{"disk_bus", func(u *apitype.TemplateUpload) { u.DiskBus = "IDE" }},
		{"os_type", func(u *apitype.TemplateUpload) { u.OSType = "l24" }},
		{"disk_bus", func(u *apitype.TemplateUpload) { u.ImportOnly, u.DiskBus, u.OVADisk = false, "ide", "ctf4-disk1.vmdk" }},
		{"os_type", func(u *apitype.TemplateUpload) { u.ImportOnly, u.OSType, u.OVADisk = false, "win10", "ctf4-disk1.vmdk" }},
		{"ova_disk", func(u *apitype.TemplateUpload) { u.OVADisk = "ctf4-disk1.vmdk" }},
		{"ova_disk", func(u *apitype.TemplateUpload) { u.ImportOnly = false }},
	} {
		bad := u
		tt.edit(&bad)
		body := &readCounter{r: bytes.NewReader(ova)}
		_, err := n.svc.Upload(ctx, bad, bodyOf(body))
		var inv *sandbox.InvalidError
		if !errors.As(err, &inv) || inv.Field != tt.field || body.n != 0 {
			t.Errorf("%+v: %v (read %d), want refused naming %s unread", bad.BuildMode, err, body.n, tt.field)
		}
	}
	if n.uploads() != 0 || len(n.vmsNamed(t, "five")) != 0 {
		t.Fatalf("refused requests uploaded (%d) or built", n.uploads())
	}
	u.DiskBus = "ide"
	if _, err := n.svc.Upload(ctx, u, bodyOf(bytes.NewReader(ova))); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	st, _ := n.svc.Build("five")
	for st.State != apitype.BuildFailed && st.State != apitype.BuildDone && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		st, _ = n.svc.Build("five")
	}
	if st.State != apitype.BuildFailed || !strings.Contains(st.Error, "holds 5 disks and ide takes 4") {
		t.Errorf("five disks on ide: %+v", st)
	}
	if vms := n.vmsNamed(t, "five"); len(vms) != 0 {
		t.Errorf("a refused import left VMs %+v", vms)
	}
}

// TestImportOnlyModeIsIdentity: a template is found by its name, and how
// it was built is part of what it is: an upload of the same image asked
// the other way (booted, or imported on another bus) is a 409 conflict
// naming both modes, its body unread, never a reuse of the template; a
// running build of the name in another mode is a conflict too; the
// booted build of an OVA (ova_disk) is as before.
func TestImportOnlyModeIsIdentity(t *testing.T) {
	ova := victimOVA(t, 2)
	n, imp := importNode(t, ova, "box", "ide")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	close(n.agent.gate) // the booted build's agent answers
	booted := imp
	booted.BuildMode, booted.OVADisk = apitype.BuildMode{}, "ctf4-disk1.vmdk"
	if _, err := n.svc.Upload(ctx, booted, bodyOf(bytes.NewReader(ova))); err != nil {
		t.Fatal(err)
	}
	first := n.waitState(t, "box", apitype.BuildDone)
	if first.ImportOnly || !n.started(first.VMID) {
		t.Errorf("the booted build %+v: want booted", first)
	}
	conflict := func(what string, u apitype.TemplateUpload, says ...string) {
		t.Helper()
		body := &readCounter{r: bytes.NewReader(ova)}
		st, err := n.svc.Upload(ctx, u, bodyOf(body))
		if !errors.Is(err, templatebuild.ErrBuildConflict) || body.n != 0 {
			t.Errorf("%s: %+v %v (read %d), want a conflict unread", what, st, err, body.n)
			return
		}
		for _, s := range says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %v, want it to say %q", what, err, s)
			}
		}
	}
	conflict("the image of a booted template uploaded import-only", imp, "booted", "imported without boot (disks on ide, ostype l26)")

	imp.Name = "box-i"
	if _, err := n.svc.Upload(ctx, imp, bodyOf(bytes.NewReader(ova))); err != nil {
		t.Fatal(err)
	}
	second := n.waitState(t, "box-i", apitype.BuildDone)
	sata := imp
	sata.DiskBus = "sata"
	conflict("an import-only template asked on another bus", sata, "disks on ide", "disks on sata")
	bootedI := booted
	bootedI.Name = "box-i"
	conflict("an import-only template asked booted", bootedI, "imported without boot", "booted")
	if st, err := n.svc.Upload(ctx, imp, bodyOf(bytes.NewReader(ova))); err != nil || !st.Reused || st.VMID != second.VMID {
		t.Errorf("the same mode again: %+v %v, want reused", st, err)
	}

	// a running build of the name: another mode is a conflict, not a join
	other := victimOVA(t, 1)
	h := sha256.Sum256(other)
	run := apitype.TemplateUpload{Name: "box-r", File: "one.ova", SHA256: hex.EncodeToString(h[:]), Size: int64(len(other)), BuildMode: apitype.BuildMode{ImportOnly: true}}
	pr, pw := io.Pipe()
	ended := make(chan error, 1)
	go func() {
		_, err := n.svc.Upload(ctx, run, bodyOf(pr))
		ended <- err
	}()
	if _, err := pw.Write(other[:100]); err != nil {
		t.Fatal(err)
	}
	ide := run
	ide.DiskBus = "ide"
	if _, err := n.svc.Upload(ctx, ide, bodyOf(bytes.NewReader(other))); !errors.Is(err, templatebuild.ErrBuildConflict) {
		t.Errorf("another mode while the build runs: %v, want a conflict", err)
	}
	same := run
	same.DiskBus = "scsi" // the default written out: the same build
	if st, err := n.svc.Upload(ctx, same, bodyOf(bytes.NewReader(other))); err != nil || !st.Joined {
		t.Errorf("the same mode written out while the build runs: %+v %v, want joined", st, err)
	}
	if _, err := pw.Write(other[100:]); err != nil {
		t.Fatal(err)
	}
	_ = pw.Close()
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	r := n.waitState(t, "box-r", apitype.BuildDone)
	if conf, err := n.px.VMConfig(ctx, r.VMID); err != nil || !strings.HasSuffix(conf["scsi0"], "size=8G") || conf["scsihw"] != hardening.SCSIHW {
		t.Errorf("one disk on scsi: %v %v", conf, err)
	}
}

// TestImportOnlyFromVolumeOnEmulator: `template build NAME --from
// local:import/FILE.ova --import-only` on the node (Builder.Run): the OVA
// already on the node is built without boot; a second run reuses it, and
// a booted build of the name is refused naming both modes.
func TestImportOnlyFromVolumeOnEmulator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := newEmuNode(t, nil)
	e.s.SetStorageContent("local", "backup,iso,vztmpl,import,snippets,images")
	e.upload(t, "ctf4.ova", victimOVA(t, 2))
	img, err := templatebuild.ImportVolume("local:import/ctf4.ova")
	if err != nil {
		t.Fatal(err)
	}
	build := func(m templatebuild.Mode, r templatebuild.Recipe) (templatebuild.Result, string, error) {
		var out bytes.Buffer
		b, err := templatebuild.New(e.px, e.agent, templatebuild.NodeHost{StateDir: e.ledger}, templatebuild.Options{Name: "victim", Recipe: r, Mode: m,
			Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local", Bridge: "bzv0", AgentWait: time.Second, AgentPoll: 20 * time.Millisecond, Progress: &out})
		if err != nil {
			return templatebuild.Result{}, "", err
		}
		res, err := b.Run(ctx)
		return res, out.String(), err
	}
	m := templatebuild.Mode{ImportOnly: true, DiskBus: "sata", OSType: "win10"}
	res, out, err := build(m, templatebuild.Generic(img))
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	conf, err := e.px.VMConfig(ctx, res.VMID)
	if err != nil || conf["sata0"] == "" || conf["sata1"] == "" || conf["ostype"] != "win10" || conf["machine"] != hardening.MinMachine || len(hardening.Check(conf).TemplateFailures()) != 0 {
		t.Errorf("template %v %v", conf, err)
	}
	again, out, err := build(m, templatebuild.Generic(img))
	if err != nil || !again.Reused || again.VMID != res.VMID {
		t.Errorf("second run: %+v %v\n%s", again, err, out)
	}
	disk, err := templatebuild.ImageFromVolume("local:import/ctf4.ova/ctf4-disk1.vmdk")
	if err != nil {
		t.Fatal(err)
	}
	if _, out, err := build(templatebuild.Mode{}, templatebuild.Generic(disk)); err == nil || !strings.Contains(err.Error(), "imported without boot (disks on sata, ostype win10), not booted") {
		t.Errorf("a booted build of the name: %v\n%s", err, out)
	}
	if _, _, err := build(m, templatebuild.Generic(disk)); err == nil || !strings.Contains(err.Error(), "name the OVA whole") {
		t.Errorf("an import-only build of one disk of an OVA: %v", err)
	}
	if _, _, err := build(templatebuild.Mode{DiskBus: "ide"}, templatebuild.Generic(disk)); err == nil || !strings.Contains(err.Error(), "--disk-bus") {
		t.Errorf("a disk bus without --import-only: %v", err)
	}
}

// uefiOVA is an OVA exported with UEFI firmware (VMware's firmware efi:
// Proxmox's import-metadata says bios ovmf and efidisk0), 4 CPUs and
// 6144 MB.
func uefiOVA(t *testing.T) []byte {
	ovf := pveemu.OVF{Name: "uefi-box", OS: 96, Bus: "scsi", Disks: []pveemu.OVFDisk{{File: "uefi-disk1.vmdk", Size: 2 << 30}}, CPUs: 4, MemoryMiB: 6144, EFI: true}.Descriptor()
	return tarOf(t, "uefi.ovf", []byte(ovf), "uefi-disk1.vmdk", vmdkHeader(2<<30))
}

// TestImportOnlyUEFIOVANeedsAllowUEFI: on a node whose [api] allow_uefi
// is off (ServiceOptions.Defaults.AllowUEFI, the daemon's config), an
// import-only build of a UEFI OVA fails naming the option before it
// creates anything on the node: every create there would refuse the
// template (its clones boot OVMF), which the build made anyway before.
func TestImportOnlyUEFIOVANeedsAllowUEFI(t *testing.T) {
	ova := uefiOVA(t)
	n, u := importNode(t, ova, "uefi", "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.svc.Upload(ctx, u, bodyOf(bytes.NewReader(ova))); err != nil {
		t.Fatal(err)
	}
	failed := n.waitEnded(t, "uefi")
	if failed.State != apitype.BuildFailed || !strings.Contains(failed.Error, "[api] allow_uefi") || !strings.Contains(failed.Error, "UEFI firmware") {
		t.Fatalf("a UEFI OVA where allow_uefi is off: %s %q, want failed naming [api] allow_uefi", failed.State, failed.Error)
	}
	for _, r := range n.s.Requests() {
		if r.Method == "POST" && r.Path == "/nodes/pve/qemu" {
			t.Errorf("the refused build created a VM: %v", r.Params)
		}
	}
	if left := n.vmsNamed(t, "uefi"); len(left) != 0 {
		t.Errorf("VMs of the refused build: %+v", left)
	}
}

// builtUEFI builds a template "uefi" of the UEFI OVA (uefiOVA) on a node
// with [api] allow_uefi, without boot, and returns the OVA, the node, its
// upload and the done build.
func builtUEFI(t *testing.T) ([]byte, *serviceNode, apitype.TemplateUpload, apitype.TemplateBuild) {
	t.Helper()
	ova := uefiOVA(t)
	n, u := importNodeWith(t, ova, "uefi", "", func(o *templatebuild.ServiceOptions) { o.Defaults.AllowUEFI = true })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.svc.Upload(ctx, u, bodyOf(bytes.NewReader(ova))); err != nil {
		t.Fatal(err)
	}
	return ova, n, u, n.waitState(t, "uefi", apitype.BuildDone)
}

// TestUEFITemplateNotReusedWithoutAllowUEFI: a UEFI template built on a
// node with [api] allow_uefi, which a daemon started since with the
// option off is asked to build again (the same upload): answered with a
// conflict naming the option, before the body is read, nothing created
// or removed; it was reported reused, and every sample's create then
// refused it.
func TestUEFITemplateNotReusedWithoutAllowUEFI(t *testing.T) {
	ova, n, u, done := builtUEFI(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n.stop()
	<-n.ended
	since := startServiceWith(t, n.emuNode, "", n.sum, nil) // allow_uefi off
	creates := func() (k int) {
		for _, r := range n.s.Requests() {
			if r.Method == "POST" && r.Path == "/nodes/pve/qemu" || r.Method == "DELETE" {
				k++
			}
		}
		return k
	}
	before := creates()
	body := &readCounter{r: bytes.NewReader(ova)}
	st, err := since.svc.Upload(ctx, u, bodyOf(body))
	if !errors.Is(err, templatebuild.ErrBuildConflict) || !strings.Contains(err.Error(), "[api] allow_uefi is off") || st.Reused {
		t.Errorf("the UEFI template's upload where allow_uefi is off: %+v %v, want a conflict naming [api] allow_uefi", st, err)
	}
	if body.n != 0 || creates() != before {
		t.Errorf("read %d bytes of the refused upload; creates and deletes %d, were %d", body.n, creates(), before)
	}
	if left := n.vmsNamed(t, "uefi"); len(left) != 1 || left[0].VMID != done.VMID || !left[0].Template {
		t.Errorf("VMs named uefi: %+v, want the template %d kept", left, done.VMID)
	}
}

// TestImportOnlyUEFIOVAOnEmulator: a UEFI OVA (uefiOVA), uploaded for a
// build without boot on a node with [api] allow_uefi, is
// built (it was refused) with bios ovmf and a new EFI vars disk of
// efitype 4m without pre-enrolled keys (qemu-server sizes it 4M), the
// OVF's memory and cores; the template passes the profile for the creates
// that may clone it (firmware uefi) and not for others; a clone
// configured with UEFI, as a create asking firmware uefi is, keeps the
// template's EFI disk (linked) and passes that profile.
func TestImportOnlyUEFIOVAOnEmulator(t *testing.T) {
	_, n, _, done := builtUEFI(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := strings.Join(done.Progress, "\n")
	for _, want := range []string{"the OVF asks for UEFI firmware", "efitype=4m,pre-enrolled-keys=0", "memory 6144 MiB, cores 4, as the OVF says"} {
		if !strings.Contains(out, want) {
			t.Errorf("progress lacks %q:\n%s", want, out)
		}
	}
	conf, err := n.px.VMConfig(ctx, done.VMID)
	if err != nil {
		t.Fatal(err)
	}
	if conf["template"] != "1" || conf["bios"] != "ovmf" || conf["memory"] != "6144" || conf["cores"] != "4" ||
		!strings.HasPrefix(conf["efidisk0"], "local-lvm:base-") || !strings.HasSuffix(conf["efidisk0"], ",efitype=4m,pre-enrolled-keys=0,size=4M") {
		t.Errorf("template config %v", conf)
	}
	if rep := hardening.CheckTemplate(conf); !rep.OK() || !rep.UEFI {
		t.Errorf("the template's profile check: %+v, want hardened for UEFI", rep.Failed())
	}
	if f := hardening.Check(conf).TemplateFailures(); len(f) == 0 {
		t.Error("a SeaBIOS create's profile takes a template of bios ovmf")
	}

	const clone = 700
	if err := n.px.CloneVM(ctx, sandbox.CloneSpec{Template: done.VMID, NewID: clone, Name: "c1"}); err != nil {
		t.Fatal(err)
	}
	if err := n.px.ConfigureVM(ctx, clone, sandbox.VMConfig{Cores: 1, MemoryMiB: 1024, Bridges: []string{"bzv0"}, UEFI: true}); err != nil {
		t.Fatalf("configure the clone with UEFI: %v", err)
	}
	cc, err := n.px.VMConfig(ctx, clone)
	if err != nil {
		t.Fatal(err)
	}
	base, _, _ := strings.Cut(strings.TrimPrefix(conf["efidisk0"], "local-lvm:"), ",")
	if cc["bios"] != "ovmf" || !strings.HasPrefix(cc["efidisk0"], "local-lvm:"+base+"/vm-700-") || !hardening.EFIDisk4M(cc["efidisk0"]) {
		t.Errorf("the clone's firmware: bios %q efidisk0 %q, want the template's EFI disk (%s) kept, linked", cc["bios"], cc["efidisk0"], base)
	}
	set, del := hardening.CloneChangesFor(cc, hardening.Want{Firmware: hardening.FirmwareUEFI})
	if err := n.px.UpdateVMConfig(ctx, clone, set, del); err != nil {
		t.Fatal(err)
	}
	if cc, err = n.px.VMConfig(ctx, clone); err != nil {
		t.Fatal(err)
	}
	if rep := hardening.CheckFor(cc, hardening.Want{Firmware: hardening.FirmwareUEFI}); !rep.OK() {
		t.Errorf("the hardened UEFI clone fails %v", rep.Failed())
	}
}
