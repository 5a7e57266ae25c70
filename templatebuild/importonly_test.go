package templatebuild

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/pveapi"
)

// TestOVADiskOrder: the disks import-metadata lists are imported in the
// OVF's order (its boot order), then any other by bus and number; an OVF
// with no disk or two disks at one key is refused, one with UEFI
// firmware is not (importConfig gives it OVMF).
func TestOVADiskOrder(t *testing.T) {
	d := func(keys ...string) map[string]pveapi.ImportDisk {
		m := map[string]pveapi.ImportDisk{}
		for _, k := range keys {
			m[k] = pveapi.ImportDisk{VolID: "local:import/x.ova/" + k + ".vmdk"}
		}
		return m
	}
	for _, tt := range []struct {
		name string
		md   pveapi.ImportMetadata
		want []string
		err  string
	}{
		{"boot order", pveapi.ImportMetadata{CreateArgs: map[string]string{"boot": "order=scsi1;ide0;scsi0"}, Disks: d("scsi0", "scsi1", "ide0")}, []string{"scsi1", "ide0", "scsi0"}, ""},
		{"no boot order", pveapi.ImportMetadata{Disks: d("scsi10", "scsi2", "ide1", "sata0")}, []string{"ide1", "sata0", "scsi2", "scsi10"}, ""},
		{"partial boot order", pveapi.ImportMetadata{CreateArgs: map[string]string{"boot": "order=sata1"}, Disks: d("sata0", "sata1", "0")}, []string{"sata1", "0", "sata0"}, ""},
		{"no disk", pveapi.ImportMetadata{}, nil, "lists no disk"},
		{"two disks at one key", pveapi.ImportMetadata{CreateArgs: map[string]string{"boot": "order=scsi0;scsi0"}, Disks: d("scsi0")}, nil, "two disks at scsi0"},
		{"uefi", pveapi.ImportMetadata{EFI: true, CreateArgs: map[string]string{"bios": "ovmf", "boot": "order=scsi0"}, Disks: d("scsi0")}, []string{"scsi0"}, ""},
	} {
		got, err := ovaDiskOrder(tt.md)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: %v %v, want %q", tt.name, got, err, tt.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v %v, want %v", tt.name, got, err, tt.want)
		}
	}
}

// TestImportSourcesRefuseForeignMembers: a disk import-metadata names
// outside the OVA built from, or with a name this build does not pass to
// import-from (white space, another extension), is refused.
func TestImportSourcesRefuseForeignMembers(t *testing.T) {
	for _, volid := range []string{"local:import/other.ova/a.vmdk", "local:import/x.ova/a b.vmdk", "local:import/x.ova/a.iso", "local:import/x.ova/sub/a.vmdk"} {
		px := newFakePVE()
		px.metadata = map[string]pveapi.ImportMetadata{"local:import/x.ova": {Disks: map[string]pveapi.ImportDisk{"ide0": {VolID: volid}}}}
		b := &Builder{px: px, o: Options{Recipe: Generic(Image{Volume: "local:import/x.ova", File: "x.ova"}), Mode: Mode{ImportOnly: true, DiskBus: BusIDE, OSType: "l26"}}}
		b.o.defaults()
		if got, err := b.importGuest(context.Background(), source{importFrom: "local:import/x.ova"}); err == nil || !strings.Contains(err.Error(), "not a disk image of the archive") {
			t.Errorf("%s: %v %v, want refused", volid, got, err)
		}
	}
}

// TestImportGuestOfTheOVF: an import-only build of an OVA takes what
// Proxmox's import-metadata reads of its OVF: UEFI firmware (bios ovmf,
// efidisk0) gives the template bios ovmf and a new EFI vars disk of the
// form a create asking firmware uefi gets; create-args' memory and cores
// size it (bounded by the API's bounds; text that is no whole number, or
// none, leaves the recipe's); an image that is no OVA keeps SeaBIOS and
// the recipe's size.
func TestImportGuestOfTheOVF(t *testing.T) {
	disks := map[string]pveapi.ImportDisk{"scsi0": {VolID: "local:import/x.ova/x.vmdk"}}
	for _, tc := range []struct {
		name           string
		file           string
		md             pveapi.ImportMetadata
		uefi           bool
		memory, cores  string
		progress, none string
	}{
		{name: "UEFI, 4 cores, 6 GiB", file: "x.ova", md: pveapi.ImportMetadata{EFI: true, CreateArgs: map[string]string{"bios": "ovmf", "cores": "4", "memory": "6144"}, Disks: disks},
			uefi: true, memory: "6144", cores: "4", progress: "memory 6144 MiB, cores 4, as the OVF says"},
		{name: "bios ovmf alone says UEFI", file: "x.ova", md: pveapi.ImportMetadata{CreateArgs: map[string]string{"bios": "ovmf"}, Disks: disks},
			uefi: true, memory: "2048", cores: "2", progress: "UEFI firmware", none: "as the OVF says"},
		{name: "SeaBIOS, sizes out of bounds", file: "x.ova", md: pveapi.ImportMetadata{CreateArgs: map[string]string{"cores": "4096", "memory": "8388608"}, Disks: disks},
			memory: "4194304", cores: "1024", progress: `memory 4194304 MiB (the OVF's "8388608", bounded to 16..4194304), cores 1024 (the OVF's "4096"`, none: "UEFI"},
		{name: "sizes below the bounds", file: "x.ova", md: pveapi.ImportMetadata{CreateArgs: map[string]string{"cores": "0", "memory": "4"}, Disks: disks},
			memory: "16", cores: "1", progress: "bounded"},
		{name: "sizes the OVF does not give as whole numbers", file: "x.ova", md: pveapi.ImportMetadata{CreateArgs: map[string]string{"cores": "", "memory": "2.5"}, Disks: disks},
			memory: "2048", cores: "2", none: "as the OVF says"},
		{name: "no OVA", file: "x.qcow2", memory: "2048", cores: "2", none: "import:"},
	} {
		px := newFakePVE()
		px.metadata = map[string]pveapi.ImportMetadata{"local:import/x.ova": tc.md}
		var out strings.Builder
		b := &Builder{px: px, o: Options{Name: "t1", Storage: "local-lvm", Recipe: Generic(Image{Volume: "local:import/" + tc.file, File: tc.file}),
			Mode: Mode{ImportOnly: true, DiskBus: BusSCSI, OSType: "l26"}, AllowUEFI: true, Progress: &out}}
		b.o.defaults()
		g, err := b.importGuest(context.Background(), source{importFrom: "local:import/" + tc.file})
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		conf := b.importConfig(g)
		wantBIOS, wantEFI := "", ""
		if tc.uefi {
			wantBIOS, wantEFI = "ovmf", "local-lvm:1,efitype=4m,pre-enrolled-keys=0"
		}
		if conf["bios"] != wantBIOS || conf["efidisk0"] != wantEFI || conf["memory"] != tc.memory || conf["cores"] != tc.cores || conf["scsi0"] == "" {
			t.Errorf("%s: create %v, want bios %q efidisk0 %q memory %s cores %s", tc.name, conf, wantBIOS, wantEFI, tc.memory, tc.cores)
		}
		if tc.progress != "" && !strings.Contains(out.String(), tc.progress) {
			t.Errorf("%s: progress lacks %q:\n%s", tc.name, tc.progress, out.String())
		}
		if tc.none != "" && strings.Contains(out.String(), tc.none) {
			t.Errorf("%s: progress says %q:\n%s", tc.name, tc.none, out.String())
		}
	}
}

// TestImportOnlyUEFITemplate: an OVA whose OVF asks for UEFI is built
// (it was refused: "a template of the hardened profile boots SeaBIOS")
// into a template of bios ovmf with its EFI vars disk, which the build's
// profile check (hardening.CheckTemplate: the firmware of the creates
// that may clone it) passes; a SeaBIOS create's profile does not.
func TestImportOnlyUEFITemplate(t *testing.T) {
	w := newWorld()
	w.pve.content = "iso,vztmpl,import,snippets,images"
	w.pve.vols["local:import/w.ova"] = sumA
	w.pve.metadata = map[string]pveapi.ImportMetadata{"local:import/w.ova": {EFI: true, CreateArgs: map[string]string{"bios": "ovmf", "cores": "2", "memory": "4096", "boot": "order=scsi0"},
		Disks: map[string]pveapi.ImportDisk{"scsi0": {VolID: "local:import/w.ova/w.vmdk"}}}}
	img, err := ImportVolume("local:import/w.ova")
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	b, err := New(w.pve, w.agent, w.host, Options{Name: "w", Recipe: Generic(img), Mode: Mode{ImportOnly: true}, Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local", AllowUEFI: true, Progress: &out})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Run(context.Background())
	if err != nil {
		t.Fatalf("build of a UEFI OVA: %v\n%s", err, out.String())
	}
	conf := w.pve.vms[res.VMID]
	if conf["template"] != "1" || conf["bios"] != "ovmf" || !hardening.EFIDisk4M(conf["efidisk0"]) || conf["memory"] != "4096" || conf["tags"] != "inspect;pvei-template" {
		t.Errorf("template %v", conf)
	}
	if !res.Report.UEFI || len(res.Report.TemplateFailures()) != 0 {
		t.Errorf("report %+v, want hardened for UEFI", res.Report)
	}
	if f := hardening.Check(conf).TemplateFailures(); len(f) != 1 || f[0].Fix != hardening.FixRebuild {
		t.Errorf("a SeaBIOS create's check of it: %v, want the firmware refused", f)
	}

	// The node's [api] allow_uefi turned off since: a build of the name
	// does not report the template reused (every create here refuses
	// it), nor touches it; turned on again, it is reused.
	vms := len(w.pve.vms)
	for _, allow := range []bool{false, true} {
		out.Reset()
		again, err := New(w.pve, w.agent, w.host, Options{Name: "w", Recipe: Generic(img), Mode: Mode{ImportOnly: true}, Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local", AllowUEFI: allow, Progress: &out})
		if err != nil {
			t.Fatal(err)
		}
		res2, err := again.Run(context.Background())
		switch {
		case !allow && (!errors.Is(err, ErrBuildConflict) || !strings.Contains(err.Error(), "built earlier, boots UEFI firmware") || !strings.Contains(err.Error(), "[api] allow_uefi is off")):
			t.Errorf("a build of the UEFI template's name where allow_uefi is off: %+v %v, want a conflict naming [api] allow_uefi", res2, err)
		case allow && (err != nil || !res2.Reused || res2.VMID != res.VMID):
			t.Errorf("a build of the UEFI template's name where allow_uefi is on: %+v %v, want it reused", res2, err)
		}
		if got := w.pve.vms[res.VMID]; len(w.pve.vms) != vms || got["template"] != "1" || got["bios"] != "ovmf" {
			t.Errorf("allow_uefi %v: VMs %d (was %d), template %v: want the template untouched", allow, len(w.pve.vms), vms, got)
		}
	}
}
