package sandbox

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// A VM's per-VM options (apitype.VMRequest: firmware, cpu, os_type,
// disk_controller, nic_controller) change its hardware; the design
// decisions:
//
//   - They are set on the clone in the configure step (ConfigureVM: one
//     request with the NICs, tags, cores and memory), and the hardened
//     profile is then checked as they want it (hardening.CheckFor).
//   - A request with any of them set never claims a warm pool member
//     (PoolShape.matches): a member is configured already, and pool
//     shapes have none of them.
//   - UEFI (SMM emulation on, a pflash device) and Windows (Hyper-V
//     enlightenments) add host-side code a guest reaches: each is refused
//     unless the node's config allows it (Options.AllowUEFI,
//     Options.AllowWindows).
//   - disk_controller cannot be applied to a clone (its disks are the
//     template's): "scsi" is checked against the template, as the
//     reference plugin does for its templates.
//   - A Windows VM's exec and file calls go through Options.WinGuests
//     (qga's Windows guest: guest-exec and batch files, Windows paths);
//     without it they are refused (GuestIO). The containment check is
//     refused for it whatever the options (CheckIO: its probes are Linux
//     programs and /proc reads). It is not named in its guest (its
//     siblings resolve it), and a sandbox with one takes no env (refused
//     by the API: the env file is a Linux path read by POSIX shells).

// hasVMOptions reports whether v sets any per-VM option.
func hasVMOptions(v apitype.VMRequest) bool {
	return v.Firmware != "" || v.CPU != "" || v.OSType != "" || v.DiskController != "" || v.NICController != ""
}

// profileWant is the hardened profile as a VM's firmware, cpu and os_type
// want it.
func profileWant(firmware, cpu, ostype string) hardening.Want {
	w := hardening.Want{OSType: ostype, CPU: cpu}
	if firmware == hardening.FirmwareUEFI {
		w.Firmware = hardening.FirmwareUEFI
	}
	return w
}

// checkVMOptionsAllowed refuses the options this node does not take.
func (m *Engine) checkVMOptionsAllowed(req apitype.CreateRequest) error {
	for i, v := range req.VMs {
		f := fmt.Sprintf("vms[%d]", i)
		if v.Firmware == hardening.FirmwareUEFI && !m.o.AllowUEFI {
			return invalid(f+".firmware", "firmware \"uefi\" is not allowed on this node: OVMF on q35 keeps SMM emulation on and adds a pflash device, host-side code the profile's SeaBIOS leaves out; an operator allows it with [api] allow_uefi = true")
		}
		if hardening.IsWindows(v.OSType) && !m.o.AllowWindows {
			return invalid(f+".os_type", "os_type %q is not allowed on this node: a Windows guest gets Hyper-V enlightenments (KVM's Hyper-V emulation, reachable from the guest); an operator allows it with [api] allow_windows = true", v.OSType)
		}
	}
	return nil
}

var reSCSIHW = regexp.MustCompile(`^virtio-scsi-(pci|single)$`)

// diskControllerMismatch says why a template's configuration conf does
// not have its disks on controller want ("scsi": every disk on scsiN, on
// a virtio-scsi controller); "" when it does, or want is empty.
func diskControllerMismatch(conf map[string]string, want string) string {
	if want == "" {
		return ""
	}
	var buses []string
	for k, v := range conf {
		m := reDiskSlot.FindStringSubmatch(k)
		if m == nil || slices.Contains(strings.Split(v, ","), "media=cdrom") {
			continue
		}
		buses = append(buses, m[1])
	}
	slices.Sort(buses)
	buses = slices.Compact(buses)
	switch {
	case len(buses) == 0:
		return "it has no disk"
	case !slices.Equal(buses, []string{want}):
		return "its disks are on " + strings.Join(buses, ", ")
	case want == "scsi" && !reSCSIHW.MatchString(conf["scsihw"]):
		hw := conf["scsihw"]
		if hw == "" {
			hw = "lsi (qemu-server's default)"
		}
		return "its SCSI controller is " + hw + ", not virtio-scsi"
	}
	return ""
}

var reDiskSlot = regexp.MustCompile(`^(ide|sata|scsi|virtio)\d+$`)

// GuestIO refuses the daemon's guest I/O (exec, file reads and writes)
// on VM v when this engine cannot reach its guest with them: a Windows
// guest when no Windows guest client is configured (Options.WinGuests).
func (m *Engine) GuestIO(v apitype.VM) error {
	if hardening.IsWindows(v.OSType) && m.o.WinGuests == nil {
		return refuse(ErrConflict, "vm %s runs Windows (os_type %s): this daemon has no Windows guest client, and its Linux one runs POSIX sh and Linux paths in the guest, so exec and file calls are not offered for it; reach it from a Linux VM of the sandbox", v.Name, v.OSType)
	}
	return nil
}

// CheckIO refuses the containment check from VM v when its guest cannot
// run it: a Windows guest, as the check's probes are Linux programs that
// read /proc and /sys.
func CheckIO(v apitype.VM) error {
	if hardening.IsWindows(v.OSType) {
		return refuse(ErrConflict, "vm %s runs Windows (os_type %s): the containment check's probes are Linux programs (they read /proc and /sys), so the check is not offered from it; run it from a Linux VM of the sandbox", v.Name, v.OSType)
	}
	return nil
}
