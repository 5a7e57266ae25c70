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
// disk_controller, nic_controller, agent) change its hardware; the design
// decisions:
//
//   - They are set on the clone in the configure step (ConfigureVM: one
//     request with the NICs, tags, cores and memory), and the hardened
//     profile is then checked as they want it (hardening.CheckFor).
//   - A request with any of them set never claims a warm pool member
//     (PoolShape.matches): a member is configured already, and pool
//     shapes have none of them.
//   - UEFI (SMM emulation on, a pflash device), Windows (Hyper-V
//     enlightenments) and e1000 (QEMU's emulated Intel NIC) add host-side
//     code a guest reaches: each is refused unless the node's config
//     allows it (Options.AllowUEFI, Options.AllowWindows,
//     Options.AllowE1000).
//   - disk_controller cannot be applied to a clone (its disks are the
//     template's): "scsi" or "ide" is checked against the template, as
//     the reference plugin does for its templates. ide needs no opt-in:
//     q35's ICH9 AHCI controller, which carries ide disks, is in every
//     VM (hardening/doc.go).
//   - nic_controller is the model the configure step writes on every NIC
//     (VMConfig.NICModel); the profile's nic model item checks it.
//   - agent false (a guest without qemu-ga: a VulnHub image, an
//     appliance) turns the clone's agent device off (VMConfig.NoAgent),
//     and the VM is ready once Proxmox reports it running, its CPUs
//     running too (waitRunning);
//     every call that goes through the agent refuses it before it is
//     tried (GuestIO, CheckIO: a 409 naming the VM, never a wait for an
//     agent that is not there), its rollback waits for it to run, it
//     gets no env and no naming in its guest (nameGuests; its siblings
//     name it), its health has no agent signal (checkVM), and it never
//     claims a warm pool member (pool members are agent-checked). The
//     guard does not rely on the agent: its walls are the same.
//   - A Windows VM's exec and file calls go through Options.WinGuests
//     (qga's Windows guest: guest-exec and batch files, Windows paths);
//     without it they are refused (GuestIO). The containment check is
//     refused for it whatever the options (CheckIO: its probes are Linux
//     programs and /proc reads). It is not named in its guest (its
//     siblings resolve it), and a sandbox with one takes no env (refused
//     by the API: the env file is a Linux path read by POSIX shells).

// hasVMOptions reports whether v sets any per-VM option (agent false
// included).
func hasVMOptions(v apitype.VMRequest) bool {
	return v.Firmware != "" || v.CPU != "" || v.OSType != "" || v.DiskController != "" || v.NICController != "" || !v.HasAgent()
}

// profileWant is the hardened profile as VM v's options want it.
func profileWant(v apitype.VM) hardening.Want {
	w := hardening.Want{OSType: v.OSType, CPU: v.CPU, NIC: v.NICController, NoAgent: !v.HasAgent()}
	if v.Firmware == hardening.FirmwareUEFI {
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
		if v.NICController == hardening.NICE1000 && !m.o.AllowE1000 {
			return invalid(f+".nic_controller", "nic_controller \"e1000\" is not allowed on this node: QEMU's emulated Intel NIC (registers, EEPROM, descriptor DMA) is device code a guest drives that virtio-net does not have; an operator allows it with [api] allow_e1000 = true")
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
// on VM v when this engine cannot reach its guest with them: a VM
// without a guest agent (agent false), a Windows guest when no Windows
// guest client is configured (Options.WinGuests).
func (m *Engine) GuestIO(v apitype.VM) error {
	if !v.HasAgent() {
		return errNoAgent(v, "exec and file calls go through the guest agent")
	}
	if hardening.IsWindows(v.OSType) && m.o.WinGuests == nil {
		return refuse(ErrConflict, "vm %s runs Windows (os_type %s): this daemon has no Windows guest client, and its Linux one runs POSIX sh and Linux paths in the guest, so exec and file calls are not offered for it; reach it from a Linux VM of the sandbox", v.Name, v.OSType)
	}
	return nil
}

// CheckIO refuses the containment check from VM v when its guest cannot
// run it: a VM without a guest agent, a Windows guest, as the check's
// probes are Linux programs that read /proc and /sys, a VM without any
// NIC (no_network), whose probes would reach nothing, controls included,
// or a VM whose first NIC is on a shared vnet (Check refuses it: its
// plan is a network of its sandbox's), so that FirstCheckVM passes over
// it as well.
func CheckIO(v apitype.VM) error {
	if !v.HasAgent() {
		return errNoAgent(v, "the containment check runs its probes through the guest agent of a VM that has one")
	}
	if v.NoNetwork {
		return errNoNetwork(v)
	}
	if err := errSharedFirst(v); err != nil {
		return err
	}
	if hardening.IsWindows(v.OSType) {
		return refuse(ErrConflict, "vm %s runs Windows (os_type %s): the containment check's probes are Linux programs (they read /proc and /sys), so the check is not offered from it; run it from a Linux VM of the sandbox", v.Name, v.OSType)
	}
	return nil
}

// errNoNetwork refuses the containment check from VM v, which has no
// NIC (created with no_network).
func errNoNetwork(v apitype.VM) error {
	return refuse(ErrConflict, "vm %s has no network (created with no_network): the containment check probes the node and the networks from a member whose first NIC is on a network of its sandbox, so it is not offered from it; run it from another VM of the sandbox", v.Name)
}

// errSharedFirst refuses the containment check from VM v when its first
// NIC is on a shared vnet (nil otherwise): the check's plan takes its
// gateway and subnet from a network of v's sandbox, which that NIC is not
// on.
func errSharedFirst(v apitype.VM) error {
	if len(v.Networks) == 0 {
		return nil
	}
	id, ok := apitype.SharedVNetOf(v.Networks[0])
	if !ok {
		return nil
	}
	return refuse(ErrConflict, "vm %s: its first NIC is on the shared vnet %s, not on a network of its sandbox: the containment check runs from a member whose first NIC is (put the shared vnet's NIC second, or check another member)", v.Name, id)
}

// errNoAgent refuses a call on VM v, which has no guest agent (agent
// false), saying why the call needs one.
func errNoAgent(v apitype.VM, why string) error {
	return refuse(ErrConflict, "vm %s has no guest agent (created with agent false): %s, so it is not offered for it; reach the VM over its network from a VM of the sandbox that has one", v.Name, why)
}

// FirstCheckVM returns the name of sandbox id's first member the
// containment check can run in (CheckIO: a Linux VM with a guest agent,
// or a container, which the daemon enters), "" when it has none or is
// unknown: the member a check that names none runs from when the first
// is a VM without an agent (a CTF's target listed first), a Windows VM or
// a VM without any NIC.
func (m *Engine) FirstCheckVM(id string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.sbx[id]
	if !ok {
		return ""
	}
	for _, v := range r.VMs {
		if CheckIO(v) == nil {
			return v.Name
		}
	}
	return ""
}
