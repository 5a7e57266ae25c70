package pveemu

import (
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// putImport writes data as import/name of the dir storage.
func (e *env) putImport(name string, data []byte) {
	e.t.Helper()
	if err := os.MkdirAll(e.importDir(), 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.importDir(), name), data, 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// TestImportMetadata: GET .../import-metadata of an OVA answers what
// OVF.pm reads of its .ovf: the disks by their controller's bus and
// address, each an import-from source of the archive's member with its
// virtual size, the boot order in the OVF's order, the ostype its
// OperatingSystemSection id maps to, the NICs' models, and the warning
// that the OVA needs extracting; an OVMF guest adds efidisk0 and
// efi-state-lost.
func TestImportMetadata(t *testing.T) {
	e, _ := importEnv(t)
	ovf := OVFDescriptor("CTF 4 (victim)", 96, "ide", OVFDisk{File: "ctf4-disk1.vmdk", Size: 8 << 30}, OVFDisk{File: "ctf4-disk2.vmdk", Size: 1 << 30})
	e.putImport("ctf4.ova", ovaImage(t, map[string][]byte{"ctf4.ovf": []byte(ovf), "ctf4-disk1.vmdk": vmdkImage(8 << 30), "ctf4-disk2.vmdk": vmdkImage(1 << 30)}))
	got, _ := e.ok("GET", "/nodes/pve/storage/local/import-metadata", url.Values{"volume": {"import/ctf4.ova"}}).(map[string]any)
	want := map[string]any{
		"type": "vm", "source": "import/ctf4.ova",
		"create-args": map[string]any{"name": "CTF-4-victim", "cores": "1", "memory": "512", "ostype": "l26", "boot": "order=ide0;ide1"},
		"disks": map[string]any{
			"ide0": map[string]any{"volid": "local:import/ctf4.ova/ctf4-disk1.vmdk", "size": float64(8 << 30)},
			"ide1": map[string]any{"volid": "local:import/ctf4.ova/ctf4-disk2.vmdk", "size": float64(1 << 30)},
		},
		"warnings": []any{map[string]any{"type": "ova-needs-extracting"}},
		"net":      map[string]any{"net0": map[string]any{"model": "e1000"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("import-metadata:\n got %v\nwant %v", got, want)
	}

	// a VMware EFI guest on SCSI
	efi := strings.Replace(OVFDescriptor("w", 119, "scsi", OVFDisk{File: "w.vmdk", Size: 3 << 20}), "</VirtualHardwareSection>",
		`<vmw:Config ovf:required="false" vmw:key="firmware" vmw:value="efi" xmlns:vmw="http://www.vmware.com/schema/ovf"/></VirtualHardwareSection>`, 1)
	e.putImport("w.ova", ovaImage(t, map[string][]byte{"w.ovf": []byte(efi), "w.vmdk": vmdkImage(3 << 20)}))
	got, _ = e.ok("GET", "/nodes/pve/storage/local/import-metadata", url.Values{"volume": {"import/w.ova"}}).(map[string]any)
	args, _ := got["create-args"].(map[string]any)
	disks, _ := got["disks"].(map[string]any)
	if args["bios"] != "ovmf" || args["ostype"] != "win10" || disks["efidisk0"] != float64(1) || len(got["warnings"].([]any)) != 2 {
		t.Errorf("EFI guest: %v", got)
	}
	if d, _ := disks["scsi0"].(map[string]any); d["volid"] != "local:import/w.ova/w.vmdk" || d["size"] != float64(3<<20) {
		t.Errorf("EFI guest's disk: %v", disks)
	}

	// the firmware set as VMware exports it (OVF.Descriptor), with its
	// CPUs and memory: create-args as text, memory the VirtualQuantity
	// whatever its AllocationUnits
	big := OVF{Name: "big", OS: 96, Bus: "sata", Disks: []OVFDisk{{File: "b.vmdk", Size: 3 << 20}}, CPUs: 4, MemoryMiB: 6144, EFI: true}.Descriptor()
	e.putImport("big.ova", ovaImage(t, map[string][]byte{"big.ovf": []byte(big), "b.vmdk": vmdkImage(3 << 20)}))
	got, _ = e.ok("GET", "/nodes/pve/storage/local/import-metadata", url.Values{"volume": {"import/big.ova"}}).(map[string]any)
	args, _ = got["create-args"].(map[string]any)
	disks, _ = got["disks"].(map[string]any)
	if args["bios"] != "ovmf" || args["cores"] != "4" || args["memory"] != "6144" || args["boot"] != "order=sata0" || disks["efidisk0"] != float64(1) {
		t.Errorf("an EFI guest of 4 CPUs and 6144 MB: %v", got)
	}
}

// TestImportMetadataRefusals: what is not an OVA, or whose OVF names a
// path outside the archive's directory, is refused as Proxmox refuses it;
// a disk item OVF.pm cannot follow is left out.
func TestImportMetadataRefusals(t *testing.T) {
	e, _ := importEnv(t)
	bad := OVFDescriptor("x", 96, "ide", OVFDisk{File: "../etc/passwd", Size: 1 << 30})
	e.putImport("bad.ova", ovaImage(t, map[string][]byte{"x.ovf": []byte(bad)}))
	skip := strings.Replace(OVFDescriptor("x", 96, "ide", OVFDisk{File: "a.vmdk", Size: 1 << 30}), "/disk/vmdisk1", "vmdisk1", 1)
	e.putImport("skip.ova", ovaImage(t, map[string][]byte{"x.ovf": []byte(skip)}))
	e.putImport("noovf.ova", ovaImage(t, map[string][]byte{"a.vmdk": vmdkImage(1 << 30)}))
	for _, c := range []struct{ volume, reason string }{
		{"import/cloud.qcow2", "invalid format"},
		{"import/app.ova/disk1.vmdk", "invalid format"},
		{"iso/x.iso", "invalid content type 'iso'"},
		{"local:import/app.ova", "unable to parse directory volume name 'local:import/app.ova'"},
		{"import/noovf.ova", "command 'tar -xO --wildcards --occurrence=1 -f " + filepath.Join(e.importDir(), "noovf.ova") + " '*.ovf'' failed: exit code 2"},
		{"import/none.ova", "command 'tar -xO --wildcards --occurrence=1 -f " + filepath.Join(e.importDir(), "none.ova") + " '*.ovf'' failed: exit code 2"},
		{"import/bad.ova", "referenced path '../etc/passwd' is invalid"},
	} {
		e.wantFail("GET", "/nodes/pve/storage/local/import-metadata", url.Values{"volume": {c.volume}}, 500, c.reason)
	}
	got, _ := e.ok("GET", "/nodes/pve/storage/local/import-metadata", url.Values{"volume": {"import/skip.ova"}}).(map[string]any)
	if d, _ := got["disks"].(map[string]any); len(d) != 0 {
		t.Errorf("a disk of an invalid host resource is listed: %v", got)
	}
	if _, ok := got["create-args"].(map[string]any)["boot"]; ok {
		t.Errorf("boot without disks: %v", got)
	}
}

// TestImportFromOVADisksOnIDE: a VM created with each disk of an OVA on
// an IDE slot (as import-metadata lists them) gets both, each extracted
// and imported, and converts to a template.
func TestImportFromOVADisksOnIDE(t *testing.T) {
	e, _ := importEnv(t)
	e.putImport("two.ova", ovaImage(t, map[string][]byte{"two.ovf": []byte(OVFDescriptor("two", 96, "ide", OVFDisk{File: "d1.vmdk", Size: 2 << 30}, OVFDisk{File: "d2.vmdk", Size: 1 << 30})),
		"d1.vmdk": vmdkImage(2 << 30), "d2.vmdk": vmdkImage(1 << 30)}))
	upid := e.ok("POST", "/nodes/pve/qemu", url.Values{"vmid": {"120"}, "name": {"two"}, "ostype": {"l26"},
		"ide0": {"local-lvm:0,import-from=local:import/two.ova/d1.vmdk"}, "ide1": {"local-lvm:0,import-from=local:import/two.ova/d2.vmdk"}}).(string)
	if st := e.wait(upid); st != "OK" {
		t.Fatalf("create: %s\n%s", st, e.taskLog(upid))
	}
	conf := e.config("120")
	if conf["ide0"] != "local-lvm:vm-120-disk-0,size=2G" || conf["ide1"] != "local-lvm:vm-120-disk-1,size=1G" {
		t.Fatalf("disks: ide0 %q ide1 %q", conf["ide0"], conf["ide1"])
	}
	if st := e.task("POST", "/nodes/pve/qemu/120/template", nil); st != "OK" {
		t.Fatalf("template: %s", st)
	}
	conf = e.config("120")
	if conf["ide0"] != "local-lvm:base-120-disk-0,size=2G" || conf["ide1"] != "local-lvm:base-120-disk-1,size=1G" {
		t.Errorf("template disks: ide0 %q ide1 %q", conf["ide0"], conf["ide1"])
	}
	// qemu-server takes ide0-ide3 (Drive.pm $MAX_IDE_DISKS): the schema has no ide4
	e.wantFail("POST", "/nodes/pve/qemu", url.Values{"vmid": {"121"}, "ide4": {"local-lvm:0,import-from=local:import/two.ova/d1.vmdk"}}, 400, "Parameter verification failed.")
}

// FuzzParseOVF: no OVF makes the emulator's parser panic.
func FuzzParseOVF(f *testing.F) {
	f.Add([]byte(OVFDescriptor("x", 96, "ide", OVFDisk{File: "a.vmdk", Size: 1 << 30}, OVFDisk{File: "b.vmdk", Size: 5})))
	f.Add([]byte(`<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1"><VirtualSystem/></Envelope>`))
	f.Add([]byte("<a><b>"))
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := parseOVF(data)
		if err == nil {
			_ = g.answer("local", "import/x.ova")
		}
	})
}
