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

// Want is what a create asks of one VM beyond the defaults; the zero
// value is the profile's default (Linux, SeaBIOS, the template's CPU
// model).
type Want struct {
	// OSType is one of OSTypes ("" for l26).
	OSType string
	// Firmware is FirmwareSeaBIOS or FirmwareUEFI ("" for SeaBIOS).
	Firmware string
	// CPU is one of CPUModels ("" keeps the template's).
	CPU string
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

// EFIDisk4M reports whether an efidisk0 value is a volume with efitype=4m
// (the 4 MiB OVMF images; without it qemu-server takes the legacy 2 MiB
// ones, OVMF.pm get_ovmf_files).
func EFIDisk4M(v string) bool {
	parts := strings.Split(v, ",")
	return len(parts) > 1 && parts[0] != "" && !strings.Contains(parts[0], "=") && slices.Contains(parts[1:], "efitype=4m")
}
