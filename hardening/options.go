package hardening

import (
	"slices"
	"strings"
)

// Firmware values of a create's per-VM options (Want.Firmware).
const (
	// FirmwareSeaBIOS is the profile's default: SeaBIOS, and qemu-server
	// adds smm=off with the serial display (should_disable_smm).
	FirmwareSeaBIOS = "seabios"
	// FirmwareUEFI is OVMF with an EFI vars disk of efitype 4m: on q35
	// qemu-server takes the SMM build of OVMF and leaves SMM on (see
	// doc.go). Opt-in per node.
	FirmwareUEFI = "uefi"
)

// OS types the profile takes (Want.OSType): the Linux default and the two
// Windows types of supported Windows releases. Each turns HPET off
// (qemu-server Cfg2Cmd/Timer.pm: hpet=off for Linux on machine 10.1+ and
// for Windows version 6 and up); the Windows ones add Hyper-V
// enlightenments (doc.go).
const (
	OSLinux      = "l26"
	OSWin10      = "win10"
	OSWin11      = "win11"
	itemCPUModel = "cpu model"
	itemHVFlags  = "hyper-v cpu flags"
	itemKVM      = "kvm (no TCG software emulation)"
	itemSCSIHW   = "scsi controller (virtio-scsi)"
	itemNICModel = "nic model"
)

// OSTypes are the os_type values a create may ask for.
var OSTypes = []string{OSLinux, OSWin10, OSWin11}

// CPUModels are the CPU models a create may ask for: QEMU's generic x86-64
// ABI levels (qemu-server CPUConfig.pm, reported as qemu64), the
// historical kvm64 and qemu64, and host. None carries nested
// virtualization: the profile adds -nested-virt to whichever is set, host
// included (qemu-server resolves it to -vmx or -svm from the host's
// flags, CPUConfig.pm resolve_cpu_flags). Custom models (custom-NAME) are
// not taken: their flags live in the node's cpu-models.conf, outside the
// VM's config and so outside the check.
var CPUModels = []string{"x86-64-v2", "x86-64-v2-AES", "x86-64-v3", "x86-64-v4", "kvm64", "qemu64", "host"}

// NIC models a create may ask for (Want.NIC): qemu-server's model names
// (QemuServer/Network.pm $nic_model_list).
const (
	// NICVirtio is the profile's default: virtio-net-pci, a paravirtual
	// device of a few queues.
	NICVirtio = "virtio"
	// NICE1000 is QEMU's emulated Intel 82540EM (device e1000), for a
	// guest without virtio drivers: its register set, EEPROM and DMA
	// descriptor rings are host-side code the guest drives. Opt-in per
	// node.
	NICE1000 = "e1000"
)

// Disk buses a create may ask a template's disks to be on
// (apitype.VMRequest.DiskController): a clone keeps its template's disks.
const (
	// DiskSCSI: every disk on scsiN, with a virtio-scsi controller (the
	// scsi item wants that of any scsiN disk).
	DiskSCSI = "scsi"
	// DiskIDE: every disk on ideN, ide-hd devices on q35's ICH9 AHCI
	// controller (bus ide.N), which every q35 VM has whatever its disks
	// (qemu-server DriveDevice.pm print_drivedevice_full).
	DiskIDE = "ide"
)

// Want is what a create asks of one VM beyond the defaults; the zero
// value is the profile's default (Linux, SeaBIOS, the template's CPU
// model, virtio NICs, the guest agent on).
type Want struct {
	// OSType is one of OSTypes ("" for l26).
	OSType string
	// Firmware is FirmwareSeaBIOS or FirmwareUEFI ("" for SeaBIOS).
	Firmware string
	// CPU is one of CPUModels ("" keeps the template's).
	CPU string
	// NIC is NICVirtio or NICE1000 ("" for virtio): the model of every
	// netN. The configure step writes it (pveapi ConfigureVM); the nic
	// model item checks it, and no clone change fixes it.
	NIC string
	// NoAgent: the VM's guest has no guest agent (a create's agent
	// false): the agent item wants the agent device off (agent absent or
	// enabled=0: qemu-server then adds no virtio-serial port and no qga
	// socket, config_to_command), which a clone change sets.
	NoAgent bool
}

func (w Want) nic() string {
	if w.NIC == "" {
		return NICVirtio
	}
	return w.NIC
}

func (w Want) osType() string {
	if w.OSType == "" {
		return OSLinux
	}
	return w.OSType
}

// IsWindows reports whether ostype is a Windows type of qemu-server's
// (windows_version, Helpers.pm: wxp, w2k, w2k3, w2k8, wvista, winN).
func IsWindows(ostype string) bool {
	switch ostype {
	case "wxp", "w2k", "w2k3", "w2k8", "wvista":
		return true
	}
	return strings.HasPrefix(ostype, "win")
}

// osItem is the name of the OS type item for ostype.
func osItem(ostype string) string {
	if IsWindows(ostype) {
		return "hpet off (windows guest, hyper-v enlightenments)"
	}
	return "hpet off (linux guest)"
}

// firmwareItem is the firmware item: SeaBIOS (only a rebuilt template
// fixes it), or, for a create that asks for UEFI, OVMF with an EFI vars
// disk of efitype 4m (the create's configure step allocates it).
func firmwareItem(conf map[string]string, want Want) Item {
	bios := conf["bios"]
	if want.Firmware != FirmwareUEFI {
		// a UEFI template: rebuilt with SeaBIOS, or cloned by creates that
		// ask for firmware uefi where the node allows it
		return Item{Name: "no SMM emulation (SeaBIOS, serial display)", Want: "bios=seabios (or a create's firmware uefi)", Got: kv(conf, "bios"), OK: bios == "" || bios == FirmwareSeaBIOS, Fix: FixRebuild}
	}
	got := strings.TrimSpace(kv(conf, "bios") + " " + kv(conf, "efidisk0"))
	return Item{Name: "uefi (OVMF 4m, efidisk0)", Want: "bios=ovmf, efidisk0 with efitype=4m", Got: got, OK: bios == "ovmf" && EFIDisk4M(conf["efidisk0"]), Fix: FixClone}
}

// NewEFIDisk is the value of a new EFI vars disk on storage: efitype 4m
// (OVMF_VARS_4M.fd, the SMM build's on q35) and no pre-enrolled keys
// (secure boot off, as the reference plugin). qemu-server's create_disks
// allocates it with the vars image's size whatever the number (OVMF.pm
// create_efidisk).
func NewEFIDisk(storage string) string { return storage + ":1,efitype=4m,pre-enrolled-keys=0" }

// EFIDisk4M reports whether an efidisk0 value is a volume with efitype=4m
// (the 4 MiB OVMF images; without it qemu-server takes the legacy 2 MiB
// ones, OVMF.pm get_ovmf_files).
func EFIDisk4M(v string) bool {
	parts := strings.Split(v, ",")
	return len(parts) > 1 && parts[0] != "" && !strings.Contains(parts[0], "=") && slices.Contains(parts[1:], "efitype=4m")
}
