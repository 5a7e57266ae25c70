package pveemu

import (
	"fmt"
	"strings"
)

// pveMachineRevision is the highest +pveN revision of a QEMU machine
// version (qemu-server Machine.pm $PVE_MACHINE_VERSION; 0 when it has
// none, as 10.1).
func pveMachineRevision(version string) int {
	return map[string]int{"4.1": 2, "9.2": 1, "10.0": 1, "11.0": 2}[version]
}

// latestMachineVersion is the machine version of the installed QEMU with
// its pve revision (Machine.pm latest_installed_machine_version: "10.1"
// for QEMUVersion 10.1.2).
func latestMachineVersion() string {
	f := strings.SplitN(QEMUVersion, ".", 3)
	v := f[0] + "." + f[1]
	if rev := pveMachineRevision(v); rev > 0 {
		v += fmt.Sprintf("+pve%d", rev)
	}
	return v
}

// isWindowsOSType is qemu-server's windows_version (Helpers.pm) being
// non-zero: wxp, w2k, w2k3, w2k8, wvista and winN.
func isWindowsOSType(ostype string) bool {
	switch ostype {
	case "wxp", "w2k", "w2k3", "w2k8", "wvista":
		return true
	}
	return strings.HasPrefix(ostype, "win")
}

// pinWindowsMachine is Machine.pm check_and_pin_machine_string: for a
// Windows ostype whose machine's type is unset, pc or q35, the type pinned
// to the installed QEMU's machine version (windows_get_pinned_machine_version
// without a base version: pc-i440fx-, pc-q35-), the other properties
// kept, the type written first and unnamed as print_machine writes it
// (its default_key; the emulator keeps the other properties in their
// order); else machine unchanged. ok reports a pin.
func pinWindowsMachine(machine, ostype string) (pinned string, ok bool) {
	if !isWindowsOSType(ostype) {
		return machine, false
	}
	parts := strings.Split(machine, ",")
	idx, typ := -1, ""
	for i, p := range parts {
		if k, val, isKV := strings.Cut(p, "="); isKV && k == "type" {
			idx, typ = i, val
		} else if !isKV && i == 0 && p != "" {
			idx, typ = i, p
		}
	}
	var name string
	switch typ {
	case "", "pc":
		name = "pc-i440fx-" + latestMachineVersion()
	case "q35":
		name = "pc-q35-" + latestMachineVersion()
	default:
		return machine, false
	}
	out := []string{name}
	for i, p := range parts {
		if i != idx && p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, ","), true
}

// pinOnOSTypeLocked is update_vm_api's ostype branch: an update that sets
// ostype, and neither sets nor deletes machine with no machine pending,
// pins a Windows guest's machine as a create does.
func pinOnOSTypeLocked(v *vm, changes map[string]string, deletes []string) {
	ostype, ok := changes["ostype"]
	if !ok {
		return
	}
	if _, ok := changes["machine"]; ok {
		return
	}
	if _, ok := v.pending["machine"]; ok {
		return
	}
	for _, d := range deletes {
		if d == "machine" {
			return
		}
	}
	if m, ok := pinWindowsMachine(v.conf["machine"], ostype); ok {
		changes["machine"] = m
	}
}
