package pveemu

import (
	"net/url"
	"slices"
	"strings"
	"testing"
)

// TestNoNICVM: a configure that deletes every netN of a clone (the
// daemon's VM of no_network) takes each out of the boot order as
// update_vm_api does (boot "order=scsi0;net0" leaves "order=scsi0"; an
// order of deleted keys only goes whole); the VM then starts with no NIC: the backend is asked for a guest
// of no vnet and no MAC, which gets an agent as any VM.
func TestNoNICVM(t *testing.T) {
	for _, tc := range []struct {
		name string
		boot url.Values
		want string // boot after ("" none)
	}{
		{"order with the NIC", url.Values{"boot": {"order=scsi0;net0"}}, "order=scsi0"},
		{"order of the NIC only", url.Values{"boot": {"order=net0"}}, ""},
		{"order without the NIC", url.Values{"boot": {"order=scsi0"}}, "order=scsi0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.setupZone()
			e.clone("101")
			e.ok("PUT", "/nodes/pve/qemu/101/config", tc.boot)
			e.ok("PUT", "/nodes/pve/qemu/101/config", url.Values{"delete": {"net0"}, "cores": {"1"}})
			conf, _ := e.ok("GET", "/nodes/pve/qemu/101/config", nil).(map[string]any)
			for k := range conf {
				if strings.HasPrefix(k, "net") {
					t.Errorf("%s left: %v", k, conf[k])
				}
			}
			if got, _ := conf["boot"].(string); got != tc.want {
				t.Errorf("boot %q, want %q", got, tc.want)
			}
			if st := e.task("POST", "/nodes/pve/qemu/101/status/start", nil); st != "OK" {
				t.Fatalf("start: %s", st)
			}
			if i := slices.IndexFunc(e.fb.Calls(), func(c string) bool { return strings.HasPrefix(c, "start 101 ") }); i < 0 || e.fb.Calls()[i] != "start 101 vnet= mac=" {
				t.Errorf("backend calls %q, want a start of no vnet and no MAC", e.fb.Calls())
			}
		})
	}
}
