package pveemu

import (
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// TestNewDiskAllocation: a config update's "STORAGE:SIZE,..." allocates a
// volume as qemu-server's create_disks does: vm-<vmid>-disk-N with the
// lowest N free, an efidisk0 the size of its OVMF vars image rounded up to
// the thin pool's extent (size=4M), a plain disk its size; a storage that
// does not exist or holds no images is refused before anything changes.
// A create's new efidisk0 is sized the same way (create_disks'
// create_efidisk).
func TestNewDiskAllocation(t *testing.T) {
	e := newEnv(t)
	vm := "/nodes/pve/qemu/100"
	if st := e.task("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"100"}}); st != "OK" {
		t.Fatalf("clone: %s", st)
	}
	e.ok("PUT", vm+"/config", url.Values{"efidisk0": {"local-lvm:1,efitype=4m,pre-enrolled-keys=0"}, "bios": {"ovmf"}, "scsi1": {"local-lvm:2"}})
	conf := e.ok("GET", vm+"/config", nil).(map[string]any)
	for k, want := range map[string]string{
		"efidisk0": "local-lvm:vm-100-disk-1,efitype=4m,pre-enrolled-keys=0,size=4M",
		"scsi1":    "local-lvm:vm-100-disk-2,size=2G",
		"bios":     "ovmf",
	} {
		if conf[k] != want {
			t.Errorf("%s = %v, want %q", k, conf[k], want)
		}
	}
	if st := e.task("POST", "/nodes/pve/qemu", url.Values{"vmid": {"101"}, "name": {"uefi"}, "bios": {"ovmf"}, "efidisk0": {"local-lvm:1,efitype=4m,pre-enrolled-keys=0"}}); st != "OK" {
		t.Fatalf("create with an efidisk0: %s", st)
	}
	if conf := e.ok("GET", "/nodes/pve/qemu/101/config", nil).(map[string]any); conf["efidisk0"] != "local-lvm:vm-101-disk-0,efitype=4m,pre-enrolled-keys=0,size=4M" {
		t.Errorf("a create's efidisk0 = %v, want the 4m vars image's size", conf["efidisk0"])
	}
	for _, tc := range []struct{ val, want string }{
		{"nosuch:1,efitype=4m", "storage 'nosuch' does not exist"},
		{"local:1,efitype=4m", "storage 'local' does not support vm images"},
	} {
		r := e.do("PUT", vm+"/config", url.Values{"efidisk0": {tc.val}}, authTicket)
		if r.status == 200 || !strings.Contains(r.reason+" "+strings.Join(slices.Collect(maps.Values(r.errors())), " "), tc.want) {
			t.Errorf("%s: %d %q %v, want %q", tc.val, r.status, r.reason, r.errors(), tc.want)
		}
	}
}
