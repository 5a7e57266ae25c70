package pveemu

import (
	"net/url"
	"testing"
)

// TestWindowsOSTypePinsMachine: a config update that sets a Windows ostype
// pins an unpinned machine as a create does, unless the same update sets
// machine (API2/Qemu.pm update_vm_api, the ostype branch:
// Machine.pm check_and_pin_machine_string, which for a Windows ostype and
// machine unset, pc or q35 writes windows_get_pinned_machine_version:
// pc-i440fx-/pc-q35- with latest_installed_machine_version, "10.1" for the
// emulated QEMU 10.1.2, no pve revision of 10.1 in $PVE_MACHINE_VERSION).
// The daemon's configure step sends ostype win10/win11 with machine
// (pveapi hardware), so its own pin stands.
func TestWindowsOSTypePinsMachine(t *testing.T) {
	for _, tc := range []struct {
		name    string
		machine string     // set before
		update  url.Values // the update with the ostype
		want    string
	}{
		{"unset", "", url.Values{"ostype": {"win11"}}, "pc-i440fx-10.1"},
		{"q35", "q35", url.Values{"ostype": {"win11"}}, "pc-q35-10.1"},
		{"q35 with a property", "type=q35,enable-s3=0", url.Values{"ostype": {"win10"}}, "pc-q35-10.1,enable-s3=0"}, // print_machine: the default key (type) first, unnamed
		{"pinned", "pc-q35-10.1", url.Values{"ostype": {"win11"}}, "pc-q35-10.1"},
		{"older pin kept", "pc-q35-9.2+pve1", url.Values{"ostype": {"win11"}}, "pc-q35-9.2+pve1"},
		{"linux", "q35", url.Values{"ostype": {"l26"}}, "q35"},
		{"machine in the same update", "q35", url.Values{"ostype": {"win11"}, "machine": {"pc-q35-10.0+pve1"}}, "pc-q35-10.0+pve1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			vm := "/nodes/pve/qemu/100"
			if st := e.task("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"100"}}); st != "OK" {
				t.Fatalf("clone: %s", st)
			}
			if tc.machine != "" {
				e.ok("PUT", vm+"/config", url.Values{"machine": {tc.machine}})
			}
			e.ok("PUT", vm+"/config", tc.update)
			conf := e.ok("GET", vm+"/config", nil).(map[string]any)
			if conf["machine"] != tc.want {
				t.Errorf("machine %v after %v, want %q", conf["machine"], tc.update, tc.want)
			}
		})
	}
}

// TestWindowsCreatePinsMachine: a create with a Windows ostype pins its
// machine (API2/Qemu.pm create_vm: "always pin Windows' machine version
// on create").
func TestWindowsCreatePinsMachine(t *testing.T) {
	e := newEnv(t)
	if st := e.task("POST", "/nodes/pve/qemu", url.Values{"vmid": {"120"}, "ostype": {"win11"}, "machine": {"q35"}, "memory": {"512"}}); st != "OK" {
		t.Fatalf("create: %s", st)
	}
	conf := e.ok("GET", "/nodes/pve/qemu/120/config", nil).(map[string]any)
	if conf["machine"] != "pc-q35-10.1" {
		t.Errorf("machine %v, want pc-q35-10.1", conf["machine"])
	}
}
