package hardening

import "testing"

// TestEmulatedSCSIHBARefused: a disk on scsiN is
// driven through the controller scsihw names, and qemu-server's default
// when scsihw is unset is lsi (QemuServer.pm confdesc scsihw: enum lsi
// lsi53c810 virtio-scsi-pci virtio-scsi-single megasas pvscsi, default
// lsi). LSI 53C895A/53C810, MegaRAID SAS and PVSCSI are emulated HBAs the
// guest drives register by register: the profile refuses them whatever
// the create asks (before review 48a it passed them unless a create asked
// for disk_controller "scsi").
func TestEmulatedSCSIHBARefused(t *testing.T) {
	for _, hw := range []string{"", "lsi", "lsi53c810", "megasas", "pvscsi"} {
		t.Run("scsihw="+hw, func(t *testing.T) {
			for _, want := range []Want{{}, {OSType: OSWin11}, {Firmware: FirmwareUEFI}} {
				conf := hardenedWith(map[string]string{"scsihw": hw})
				if want.Firmware == FirmwareUEFI {
					conf["bios"], conf["efidisk0"] = "ovmf", "local-lvm:vm-100-disk-1,efitype=4m,pre-enrolled-keys=0,size=4M"
				}
				if want.OSType != "" {
					conf["ostype"] = want.OSType
				}
				if CheckFor(conf, want).OK() {
					t.Errorf("want %+v: scsi0 on scsihw %q (an emulated HBA) passes the profile", want, orNone(hw))
				}
			}
		})
	}
}

// TestMachinePropertiesRefused: machineOK reads only
// the machine's type; qemu-server's machine format also takes viommu
// (intel: QEMU's intel-iommu DMA-remapping emulation; virtio:
// virtio-iommu) and enable-s3/enable-s4 (Machine.pm $machine_fmt), each
// host-side code a guest drives: the machine item refuses any property
// but the type.
func TestMachinePropertiesRefused(t *testing.T) {
	for _, m := range []string{"q35,viommu=intel", "q35,viommu=virtio,aw-bits=48", "type=q35,enable-s3=1,enable-s4=1", "pc-q35-10.1+pve1,viommu=intel"} {
		if CheckFor(hardenedWith(map[string]string{"machine": m}), Want{}).OK() {
			t.Errorf("machine %q passes the profile", m)
		}
	}
}

// TestKVMOffRefused: qemu-server's kvm option (default
// 1; VM.Config.HWType, so any template may carry kvm: 0) runs the guest
// under TCG, QEMU's software emulator, which QEMU's security policy keeps
// out of the virtualization use case it treats as a security boundary:
// the kvm item wants kvm absent or 1. Under TCG, nested virtualization is not
// off either: the create's cpu qemu64 (hardening.CPUModels; also
// qemu-server's default model when kvm is off, CPUConfig.pm
// get_default_cpu_type; the x86-64-v* models, DefaultCPU included, are
// qemu64 with flags: their reported-model) carries SVM in QEMU's model
// (TCG_EXT3_FEATURES keeps it) and TCG emulates SVM,
// while -nested-virt resolves from the host's /proc/cpuinfo
// (resolve_cpu_flags) to -vmx on an Intel node, leaving svm on.
func TestKVMOffRefused(t *testing.T) {
	for _, want := range []Want{{}, {CPU: "qemu64"}} {
		conf := hardenedWith(map[string]string{"kvm": "0"})
		if want.CPU != "" {
			conf["cpu"] = CPUValue(conf["cpu"], want.CPU)
		}
		if CheckFor(conf, want).OK() {
			t.Errorf("want %+v: kvm 0 (TCG) passes the profile (cpu %s)", want, conf["cpu"])
		}
	}
}
