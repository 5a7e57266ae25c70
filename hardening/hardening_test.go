package hardening

import (
	"strings"
	"testing"
)

// hardened is a configuration in the profile.
func hardened() map[string]string {
	return map[string]string{
		"vga": "serial0", "serial0": "socket", "tablet": "0", "balloon": "0",
		"cpu": "x86-64-v2-AES,flags=-nested-virt", "machine": "q35", "ostype": "l26",
		"agent": "1", "scsihw": "virtio-scsi-single", "scsi0": "local-lvm:vm-100-disk-0,size=8G", "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0",
	}
}

// hardenedWith is hardened with change applied ("" deletes a key).
func hardenedWith(change map[string]string) map[string]string {
	conf := hardened()
	for k, v := range change {
		if v == "" {
			delete(conf, k)
		} else {
			conf[k] = v
		}
	}
	return conf
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change map[string]string // "" deletes
		fail   string            // the failing item ("" = all pass)
		fix    Fixer
	}{
		{"hardened", nil, "", ""},
		{"vnc display", map[string]string{"vga": "std"}, "display", FixClone},
		{"no serial", map[string]string{"serial0": ""}, "serial console", FixClone},
		{"second serial socket", map[string]string{"serial1": "socket"}, "other serial ports", FixClone},
		{"host serial", map[string]string{"serial2": "/dev/ttyS0"}, "host serial and parallel devices", FixTemplate},
		{"parallel", map[string]string{"parallel0": "/dev/parport0"}, "host serial and parallel devices", FixTemplate},
		{"usb spice", map[string]string{"usb0": "spice"}, "usb", FixClone},
		{"usb host", map[string]string{"usb1": "host=1234:5678"}, "usb host devices", FixTemplate},
		{"tablet default", map[string]string{"tablet": ""}, "usb tablet", FixClone},
		{"balloon", map[string]string{"balloon": "1024"}, "balloon", FixClone},
		{"cdrom", map[string]string{"ide2": "local:iso/debian.iso,media=cdrom"}, "cd-rom", FixClone},
		{"empty cdrom", map[string]string{"ide2": "none,media=cdrom"}, "cd-rom", FixClone},
		{"audio", map[string]string{"audio0": "device=ich9-intel-hda,driver=spice"}, "audio", FixClone},
		{"tpm", map[string]string{"tpmstate0": "local-lvm:vm-100-disk-1,size=4M,version=v2.0"}, "tpm", FixClone},
		{"watchdog", map[string]string{"watchdog": "model=i6300esb"}, "watchdog", FixClone},
		{"hostpci", map[string]string{"hostpci0": "0000:01:00.0"}, "pci passthrough", FixTemplate},
		{"virtiofs", map[string]string{"virtiofs0": "dirid=share"}, "host-shared folders", FixTemplate},
		{"args", map[string]string{"args": "-device foo -machine hpet=on"}, "args and hookscript (but a panic device)", FixTemplate},
		{"panic device", map[string]string{"args": "-device pvpanic"}, "", ""},
		{"panic device on pci", map[string]string{"args": "-device  pvpanic-pci"}, "", ""},
		{"panic device with options", map[string]string{"args": "-device pvpanic,ioport=0x505"}, "args and hookscript (but a panic device)", FixTemplate},
		{"panic device and more", map[string]string{"args": "-device pvpanic -device foo"}, "args and hookscript (but a panic device)", FixTemplate},
		{"hookscript", map[string]string{"args": "-device pvpanic", "hookscript": "local:snippets/h.sh"}, "args and hookscript (but a panic device)", FixTemplate},
		{"host cpu", map[string]string{"cpu": "host"}, "nested virtualization", FixClone},
		{"nested on", map[string]string{"cpu": "host,flags=+nested-virt;-nested-virt"}, "nested virtualization", FixClone},
		{"no cpu", map[string]string{"cpu": ""}, "nested virtualization", FixClone},
		{"i440fx", map[string]string{"machine": "pc"}, "machine", FixClone},
		{"viommu", map[string]string{"machine": "q35,viommu=virtio"}, "machine", FixClone},
		{"s3", map[string]string{"machine": "type=pc-q35-10.1,enable-s3=0"}, "machine", FixClone},
		{"pinned q35", map[string]string{"machine": "type=pc-q35-10.1+pve1"}, "", ""},
		{"kvm off", map[string]string{"kvm": "0"}, "kvm (no TCG software emulation)", FixClone},
		{"kvm on", map[string]string{"kvm": "1"}, "", ""},
		{"hyper-v flag", map[string]string{"cpu": "host,flags=+hv-tlbflush;-nested-virt"}, "hyper-v cpu flags", FixClone},
		{"hyper-v flag off", map[string]string{"cpu": "host,flags=-hv-evmcs;-nested-virt"}, "", ""},
		{"scsi on lsi", map[string]string{"scsihw": ""}, "scsi controller (virtio-scsi)", FixTemplate},
		{"scsi on pvscsi", map[string]string{"scsihw": "pvscsi"}, "scsi controller (virtio-scsi)", FixTemplate},
		{"scsi on virtio-scsi-pci", map[string]string{"scsihw": "virtio-scsi-pci"}, "", ""},
		{"virtio disk, no scsihw", map[string]string{"scsihw": "", "scsi0": "", "virtio0": "local-lvm:vm-100-disk-0,size=8G"}, "", ""},
		{"scsi cdrom only, no scsihw", map[string]string{"scsihw": "", "scsi0": "", "virtio0": "local-lvm:vm-100-disk-0,size=8G", "scsi2": "none,media=cdrom"}, "cd-rom", FixClone},
		{"old q35", map[string]string{"machine": "pc-q35-9.2+pve1"}, "machine", FixClone},
		{"windows", map[string]string{"ostype": "win11"}, "hpet off (linux guest)", FixClone},
		{"uefi", map[string]string{"bios": "ovmf"}, "no SMM emulation (SeaBIOS, serial display)", FixRebuild},
		{"no agent", map[string]string{"agent": "enabled=0"}, "guest agent (the I/O channel)", FixClone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf := hardenedWith(tc.change)
			f := Check(conf).Failed()
			if tc.fail == "" {
				if len(f) != 0 {
					t.Fatalf("failed: %v", f)
				}
				return
			}
			if len(f) != 1 || f[0].Name != tc.fail || f[0].Fix != tc.fix {
				t.Fatalf("failed %v, want only %q (fix %s)", f, tc.fail, tc.fix)
			}
			// the fixes bring it back into the profile
			set, del := TemplateChanges(conf)
			for _, k := range del {
				delete(conf, k)
			}
			for k, v := range set {
				conf[k] = v
			}
			f = Check(conf).Failed()
			if tc.fix == FixRebuild {
				if len(f) != 1 {
					t.Fatalf("after fixes: %v", f)
				}
				return
			}
			if len(f) != 0 {
				t.Fatalf("after fixes (set %v, delete %v): %v", set, del, f)
			}
		})
	}
}

func TestCloneChangesKeepCPU(t *testing.T) {
	set, del := CloneChanges(map[string]string{"cpu": "host,flags=+aes;+nested-virt,hidden=1", "args": "-x", "hostpci0": "0000:01:00.0"})
	if set["cpu"] != "host,flags=+aes;-nested-virt,hidden=1" {
		t.Fatalf("cpu %q", set["cpu"])
	}
	if strings.Contains(strings.Join(del, ","), "args") || strings.Contains(strings.Join(del, ","), "hostpci") {
		t.Fatalf("clone would delete root-only keys: %v", del)
	}
}

func FuzzCheck(f *testing.F) {
	f.Add("cpu", "host,flags=+aes;+nested-virt,hidden=1", "machine", "type=pc-q35-10.1,viommu=intel")
	f.Add("args", "-a b", "agent", "enabled=1,fstrim_cloned_disks=1")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		conf := map[string]string{k1: v1, k2: v2}
		set, del := TemplateChanges(conf)
		for _, k := range del {
			if _, ok := conf[k]; !ok {
				t.Fatalf("deletes absent key %q", k)
			}
			delete(conf, k)
		}
		for k, v := range set {
			conf[k] = v
		}
		for _, i := range Check(conf).Failed() {
			if i.Fix != FixRebuild {
				t.Fatalf("after TemplateChanges still failing: %v (conf %v)", i, conf)
			}
		}
	})
}

// TestCheckFor: the OS type, firmware and CPU model items follow a
// create's options; the clone changes bring a clone into the profile the
// options want, except the EFI disk (the configure step's).
func TestCheckFor(t *testing.T) {
	efi := "local-lvm:vm-100-disk-1,efitype=4m,pre-enrolled-keys=0,size=4M"
	for _, tc := range []struct {
		name   string
		change map[string]string // "" deletes
		want   Want
		fail   []string // the failing items
		set    map[string]string
	}{
		{"linux default", nil, Want{}, nil, map[string]string{}},
		{"win11 asked, l26 set", nil, Want{OSType: OSWin11}, []string{"machine", "hpet off (windows guest, hyper-v enlightenments)"}, map[string]string{"ostype": "win11", "machine": "pc-q35-10.1"}},
		{"win11 asked and set, machine unpinned", map[string]string{"ostype": "win11"}, Want{OSType: OSWin11}, []string{"machine"}, map[string]string{"machine": "pc-q35-10.1"}},
		{"win11 asked and set, machine pinned", map[string]string{"ostype": "win11", "machine": "pc-q35-10.1"}, Want{OSType: OSWin11}, nil, map[string]string{}},
		{"win10 asked, machine pinned newer", map[string]string{"machine": "pc-q35-11.0+pve2"}, Want{OSType: OSWin10}, []string{"hpet off (windows guest, hyper-v enlightenments)"}, map[string]string{"ostype": "win10"}},
		{"win10 asked, machine pinned older", map[string]string{"ostype": "win10", "machine": "pc-q35-9.2+pve1"}, Want{OSType: OSWin10}, []string{"machine"}, map[string]string{"machine": "pc-q35-10.1"}},
		{"hyper-v flag with a cpu model", map[string]string{"cpu": "kvm64,flags=+hv-evmcs;-nested-virt"}, Want{CPU: "host"}, []string{"hyper-v cpu flags", "cpu model"}, map[string]string{"cpu": "host,flags=-nested-virt"}},
		{"windows template, linux asked", map[string]string{"ostype": "win10"}, Want{}, []string{"hpet off (linux guest)"}, map[string]string{"ostype": "l26"}},
		{"uefi asked, seabios", nil, Want{Firmware: FirmwareUEFI}, []string{"uefi (OVMF 4m, efidisk0)"}, map[string]string{}},
		{"uefi asked and set", map[string]string{"bios": "ovmf", "efidisk0": efi}, Want{Firmware: FirmwareUEFI}, nil, map[string]string{}},
		{"uefi without an efidisk", map[string]string{"bios": "ovmf"}, Want{Firmware: FirmwareUEFI}, []string{"uefi (OVMF 4m, efidisk0)"}, map[string]string{}},
		{"uefi with a 2m efidisk", map[string]string{"bios": "ovmf", "efidisk0": "local-lvm:vm-100-disk-1,size=128K"}, Want{Firmware: FirmwareUEFI}, []string{"uefi (OVMF 4m, efidisk0)"}, map[string]string{}},
		{"uefi template, seabios asked", map[string]string{"bios": "ovmf", "efidisk0": efi}, Want{}, []string{"no SMM emulation (SeaBIOS, serial display)"}, map[string]string{}},
		{"cpu model asked", nil, Want{CPU: "host"}, []string{"cpu model"}, map[string]string{"cpu": "host,flags=-nested-virt"}},
		{"cpu model and nested on", map[string]string{"cpu": "kvm64,flags=+nested-virt;+aes"}, Want{CPU: "x86-64-v3"}, []string{"nested virtualization", "cpu model"}, map[string]string{"cpu": "x86-64-v3,flags=+aes;-nested-virt"}},
		{"cpu model kept", map[string]string{"cpu": "host,flags=-nested-virt"}, Want{CPU: "host"}, nil, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf := hardenedWith(tc.change)
			var names []string
			for _, i := range CheckFor(conf, tc.want).Failed() {
				names = append(names, i.Name)
			}
			if strings.Join(names, "|") != strings.Join(tc.fail, "|") {
				t.Fatalf("failed %q, want %q", names, tc.fail)
			}
			set, _ := CloneChangesFor(conf, tc.want)
			if len(set) != len(tc.set) {
				t.Fatalf("set %v, want %v", set, tc.set)
			}
			for k, v := range tc.set {
				if set[k] != v {
					t.Fatalf("set %v, want %v", set, tc.set)
				}
			}
		})
	}
}

func TestIsWindows(t *testing.T) {
	for ostype, want := range map[string]bool{"l26": false, "other": false, "solaris": false, "": false, "wxp": true, "w2k8": true, "win7": true, "win11": true} {
		if IsWindows(ostype) != want {
			t.Errorf("IsWindows(%q) = %v", ostype, !want)
		}
	}
}

// TestNICModelAndAgentWants: the nic model item wants every netN of the
// model a create asks (virtio unless e1000), in the short form
// ("e1000=MAC") or as model=; no clone change claims to fix it (the
// configure step writes the NICs). With NoAgent the agent item wants the
// agent device off, and the clone change deletes it.
func TestNICModelAndAgentWants(t *testing.T) {
	e1000 := "e1000=BC:24:11:00:00:01,bridge=vmbr0"
	for _, tc := range []struct {
		name   string
		change map[string]string
		want   Want
		fail   []string
	}{
		{"virtio by default", nil, Want{}, nil},
		{"an e1000 NIC by default", map[string]string{"net1": e1000}, Want{}, []string{itemNICModel}},
		{"e1000 asked, virtio given", nil, Want{NIC: NICE1000}, []string{itemNICModel}},
		{"e1000 asked and given", map[string]string{"net0": e1000, "net1": "model=e1000,macaddr=BC:24:11:00:00:02,bridge=vnet1"}, Want{NIC: NICE1000}, nil},
		{"no agent asked, agent on", nil, Want{NoAgent: true}, []string{itemNoAgent}},
		{"no agent asked and off", map[string]string{"agent": "enabled=0"}, Want{NoAgent: true}, nil},
		{"no agent asked, absent", map[string]string{"agent": ""}, Want{NoAgent: true}, nil},
		{"agent absent by default", map[string]string{"agent": ""}, Want{}, []string{itemAgent}},
		// an OVA's victim: its disk on ide0 (an ide-hd on q35's ICH9
		// AHCI controller: no controller item), no scsiN, no scsihw
		{"an ide victim", map[string]string{"scsi0": "", "scsihw": "", "ide0": "local-lvm:base-9002-disk-0,size=8G", "net0": e1000, "agent": "0"}, Want{NIC: NICE1000, NoAgent: true}, nil},
		{"an ide disk by default", map[string]string{"scsi0": "", "scsihw": "", "ide0": "local-lvm:base-9002-disk-0,size=8G"}, Want{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf := hardenedWith(tc.change)
			var got []string
			for _, it := range CheckFor(conf, tc.want).Failed() {
				got = append(got, it.Name)
				if it.Fix != FixClone {
					t.Errorf("%s: fix %s, want clone", it.Name, it.Fix)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.fail, ",") {
				t.Fatalf("failed %q, want %q", got, tc.fail)
			}
			set, del := CloneChangesFor(conf, tc.want)
			for _, k := range del {
				delete(conf, k)
			}
			for k, v := range set {
				conf[k] = v
			}
			after := CheckFor(conf, tc.want).Failed()
			switch {
			case len(tc.fail) == 1 && tc.fail[0] == itemNICModel:
				if len(after) != 1 || len(set) != 0 || len(del) != 0 {
					t.Errorf("clone changes for the NIC model: set %v del %v, after %v; want none (the configure step's)", set, del, after)
				}
			case len(after) != 0:
				t.Errorf("after the clone changes (set %v, del %v): %v", set, del, after)
			}
		})
	}
}

// TestCheckTemplate: a template is checked for the creates that may clone
// it: one of bios ovmf (an OVA's UEFI guest imported without boot) for
// firmware uefi, its EFI vars disk of efitype 4m a pass (Report.UEFI set)
// and a missing one a clone's (the configure step allocates it); any
// other for SeaBIOS, as Check. NewEFIDisk is the disk a UEFI create (and
// such a build) allocates.
func TestCheckTemplate(t *testing.T) {
	efi := "local-lvm:base-100-disk-1,efitype=4m,pre-enrolled-keys=0,size=4M"
	for _, tc := range []struct {
		name     string
		change   map[string]string
		uefi     bool
		failures []string // the template failures
		failed   []string // every failing item
	}{
		{"seabios", nil, false, nil, nil},
		{"uefi with a 4m efidisk", map[string]string{"bios": "ovmf", "efidisk0": efi}, true, nil, nil},
		{"uefi without an efidisk", map[string]string{"bios": "ovmf"}, true, nil, []string{"uefi (OVMF 4m, efidisk0)"}},
		{"uefi with args", map[string]string{"bios": "ovmf", "efidisk0": efi, "args": "-S"}, true, []string{"args and hookscript (but a panic device)"}, []string{"args and hookscript (but a panic device)"}},
	} {
		rep := CheckTemplate(hardenedWith(tc.change))
		names := func(items []Item) string {
			var out []string
			for _, i := range items {
				out = append(out, i.Name)
			}
			return strings.Join(out, "|")
		}
		if rep.UEFI != tc.uefi || names(rep.TemplateFailures()) != strings.Join(tc.failures, "|") || names(rep.Failed()) != strings.Join(tc.failed, "|") {
			t.Errorf("%s: UEFI %v, template failures %q, failed %q; want %v, %q, %q", tc.name, rep.UEFI, names(rep.TemplateFailures()), names(rep.Failed()), tc.uefi, tc.failures, tc.failed)
		}
	}
	if d := NewEFIDisk("fast-zfs"); d != "fast-zfs:1,efitype=4m,pre-enrolled-keys=0" || !EFIDisk4M(d) {
		t.Errorf("NewEFIDisk: %q", d)
	}
}
