package pveemu

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// blockFake is a FakeBackend that records the disks it is asked to
// hot-plug: slot -> by-id name.
type blockFake struct {
	*FakeBackend
	mu         sync.Mutex
	byID       map[string]string
	failDetach error // every unplug fails with it when set
}

func (b *blockFake) AttachDisk(_ context.Context, _ int, slot, _, byID string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.byID[slot] = byID
	return nil
}

func (b *blockFake) DetachDisk(_ context.Context, _ int, slot string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failDetach != nil {
		return b.failDetach
	}
	delete(b.byID, slot)
	return nil
}

// runningClone is a started clone 101 of the template with conf set
// before the start, on a backend that records hot-plugs, and a fresh
// image of it on the dir storage.
func runningClone(t *testing.T, conf url.Values) (*env, *blockFake, string) {
	e := newEnv(t)
	bf := &blockFake{FakeBackend: e.fb, byID: map[string]string{}}
	e.s.backend = bf
	e.setupZone()
	e.clone("101")
	if len(conf) > 0 {
		e.ok("PUT", "/nodes/pve/qemu/101/config", conf)
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/status/start", nil); st != "OK" {
		t.Fatalf("start: %s", st)
	}
	volid, _ := e.ok("POST", "/nodes/pve/storage/local/content", url.Values{"filename": {"vm-101-x.raw"}, "vmid": {"101"}, "size": {"4096"}, "format": {"raw"}}).(string)
	if volid == "" {
		t.Fatal("no volume id")
	}
	return e, bf, volid
}

// TestHotplugDiskName: the by-id name of a hot-plugged scsi disk follows
// the machine version (qemu-server print_drivedevice_full adds
// device_id=drive-scsiN from 10.0); running-qemu is the installed QEMU.
func TestHotplugDiskName(t *testing.T) {
	for _, tt := range []struct{ machine, want, running string }{
		{"", "scsi-0QEMU_QEMU_HARDDISK_drive-scsi1", "pc-i440fx-10.1+pve0"},
		{"q35", "scsi-0QEMU_QEMU_HARDDISK_drive-scsi1", "pc-q35-10.1+pve0"},
		{"pc-q35-10.0+pve1", "scsi-0QEMU_QEMU_HARDDISK_drive-scsi1", "pc-q35-10.0+pve0"},
		{"pc-q35-9.2+pve1", "scsi-0QEMU_QEMU_HARDDISK_abc", "pc-q35-9.2+pve0"},
		{"type=pc-i440fx-8.1,viommu=virtio", "scsi-0QEMU_QEMU_HARDDISK_abc", "pc-i440fx-8.1+pve0"},
	} {
		t.Run(tt.machine, func(t *testing.T) {
			var conf url.Values
			if tt.machine != "" {
				conf = url.Values{"machine": {tt.machine}}
			}
			e, bf, volid := runningClone(t, conf)
			if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"scsi1": {volid + ",serial=abc"}}); st != "OK" {
				t.Fatalf("attach: %s", st)
			}
			if got := bf.byID["scsi1"]; got != tt.want {
				t.Errorf("by-id %q, want %q", got, tt.want)
			}
			st := e.ok("GET", "/nodes/pve/qemu/101/status/current", nil).(map[string]any)
			if st["running-qemu"] != QEMUVersion || st["running-machine"] != tt.running {
				t.Errorf("status: running-qemu %v running-machine %v, want %s %s", st["running-qemu"], st["running-machine"], QEMUVersion, tt.running)
			}
		})
	}
}

// TestHotplugWithoutDiskStaysPending: with hotplug lacking disk the
// update succeeds, nothing is plugged, the disk shows in GET config only
// as a pending value, and deleting it leaves unused0.
func TestHotplugWithoutDiskStaysPending(t *testing.T) {
	e, bf, volid := runningClone(t, url.Values{"hotplug": {"network,usb"}})
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"scsi1": {volid + ",serial=abc"}}); st != "OK" {
		t.Fatalf("attach: %s", st)
	}
	if len(bf.byID) != 0 {
		t.Fatalf("plugged %v without the disk hotplug feature", bf.byID)
	}
	pend := e.ok("GET", "/nodes/pve/qemu/101/config", nil).(map[string]any)
	cur := e.ok("GET", "/nodes/pve/qemu/101/config", url.Values{"current": {"1"}}).(map[string]any)
	if pend["scsi1"] != volid+",serial=abc" || cur["scsi1"] != nil {
		t.Fatalf("scsi1: pending view %v, current view %v; want it pending only", pend["scsi1"], cur["scsi1"])
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"delete": {"scsi1"}, "force": {"1"}}); st != "OK" {
		t.Fatalf("detach: %s", st)
	}
	cur = e.ok("GET", "/nodes/pve/qemu/101/config", url.Values{"current": {"1"}}).(map[string]any)
	if cur["unused0"] != volid || cur["scsi1"] != nil {
		t.Fatalf("after the detach: unused0 %v scsi1 %v, want unused0 %s", cur["unused0"], cur["scsi1"], volid)
	}
}

// TestFailedHotplugStaysPending: a disk whose hot-plug QEMU refuses stays
// in the pending section and the update's task fails with qemu-server's
// "hotplug problem" for the key (vmconfig_hotplug_pending, then
// raise_param_exc); revert on the only-pending key drops it and registers
// the VM's volume as unused0 (update_vm: revert becomes a delete,
// vmconfig_register_unused_drive), and deleting unused0 frees the image
// (try_deallocate_drive).
func TestFailedHotplugStaysPending(t *testing.T) {
	schema := pendingItemSchema(t)
	e, bf, volid := runningClone(t, nil)
	val := volid + ",serial=abc"
	e.s.FailNextHotplug(101, "error on hotplug device 'virtioscsi1'")
	st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"scsi1": {val}})
	if want := "400 Parameter verification failed. scsi1: hotplug problem - error on hotplug device 'virtioscsi1'"; st != want {
		t.Fatalf("attach: %q, want %q", st, want)
	}
	if len(bf.byID) != 0 {
		t.Fatalf("plugged %v", bf.byID)
	}
	cur := e.ok("GET", "/nodes/pve/qemu/101/config", url.Values{"current": {"1"}}).(map[string]any)
	merged := e.ok("GET", "/nodes/pve/qemu/101/config", nil).(map[string]any)
	if cur["scsi1"] != nil || merged["scsi1"] != val {
		t.Fatalf("scsi1: current %v, with pending %v; want it pending only", cur["scsi1"], merged["scsi1"])
	}
	if it := pendingOf(e, schema)["scsi1"]; it == nil || it["pending"] != val {
		t.Fatalf("GET pending scsi1: %v", it)
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"revert": {"scsi1"}}); st != "OK" {
		t.Fatalf("revert: %s", st)
	}
	cur = e.ok("GET", "/nodes/pve/qemu/101/config", url.Values{"current": {"1"}}).(map[string]any)
	if p := pendingOf(e, schema); p["scsi1"] != nil || cur["unused0"] != volid {
		t.Fatalf("after the revert: pending scsi1 %v, unused0 %v; want no scsi1 and unused0 %s", p["scsi1"], cur["unused0"], volid)
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"delete": {"unused0"}}); st != "OK" {
		t.Fatalf("delete unused0: %s", st)
	}
	_, img, _, _ := e.s.volumePath("", volid)
	if _, err := os.Stat(img); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("image after deleting unused0: %v, want it freed", err)
	}
	// the next hot-plug is not failed
	volid2, _ := e.ok("POST", "/nodes/pve/storage/local/content", url.Values{"filename": {"vm-101-y.raw"}, "vmid": {"101"}, "size": {"4096"}, "format": {"raw"}}).(string)
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"scsi1": {volid2}}); st != "OK" || bf.byID["scsi1"] == "" {
		t.Fatalf("second attach: %s, plugged %v", st, bf.byID)
	}
}

// TestFailedUnplugStaysPending: a forced deletion whose unplug fails
// stays a pending deletion (delete 2 in GET .../pending), the volume
// still in the config and on the storage; revert takes the deletion back.
func TestFailedUnplugStaysPending(t *testing.T) {
	schema := pendingItemSchema(t)
	e, bf, volid := runningClone(t, nil)
	val := volid + ",serial=abc"
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"scsi1": {val}}); st != "OK" {
		t.Fatalf("attach: %s", st)
	}
	bf.failDetach = errors.New("error on hot-unplugging device 'scsi1' - still busy in guest?")
	st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"delete": {"scsi1"}, "force": {"1"}})
	if !strings.Contains(st, "scsi1: hotplug problem - error on hot-unplugging device 'scsi1'") {
		t.Fatalf("detach: %q", st)
	}
	if it := pendingOf(e, schema)["scsi1"]; it["value"] != val || it["delete"] != float64(2) {
		t.Fatalf("GET pending scsi1: %v, want its value and delete 2", it)
	}
	_, img, _, _ := e.s.volumePath("", volid)
	if _, err := os.Stat(img); err != nil {
		t.Fatalf("image after the failed unplug: %v", err)
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"revert": {"scsi1"}}); st != "OK" {
		t.Fatalf("revert: %s", st)
	}
	if it := pendingOf(e, schema)["scsi1"]; it["value"] != val || it["delete"] != nil || it["pending"] != nil {
		t.Fatalf("GET pending scsi1 after the revert: %v, want the current value only", it)
	}
	// the image the VM keeps goes with the VM (destroy_vm frees its
	// owned volumes)
	if st := e.task("POST", "/nodes/pve/qemu/101/status/stop", nil); st != "OK" {
		t.Fatalf("stop: %s", st)
	}
	if st := e.task("DELETE", "/nodes/pve/qemu/101", url.Values{"purge": {"1"}}); st != "OK" {
		t.Fatalf("destroy: %s", st)
	}
	if _, err := os.Stat(img); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("image after the destroy: %v, want it freed", err)
	}
}

// TestSCSIControllerHotplug: qemu-server hot-plugs a SCSI disk on every
// controller and the update succeeds, but only virtio-scsi and pvscsi tell
// the guest: on lsi (the default), lsi53c810 and megasas the disk is in
// the config and never reaches the guest; its unplug succeeds.
func TestSCSIControllerHotplug(t *testing.T) {
	for _, tc := range []struct {
		scsihw string
		seen   bool
	}{{"", false}, {"lsi", false}, {"lsi53c810", false}, {"megasas", false}, {"virtio-scsi-pci", true}, {"virtio-scsi-single", true}, {"pvscsi", true}} {
		t.Run(tc.scsihw, func(t *testing.T) {
			conf := url.Values{"scsihw": {tc.scsihw}}
			if tc.scsihw == "" {
				conf = url.Values{"delete": {"scsihw"}}
			}
			e, bf, volid := runningClone(t, conf)
			if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"scsi1": {volid}}); st != "OK" {
				t.Fatalf("attach: %s", st)
			}
			cur := e.ok("GET", "/nodes/pve/qemu/101/config", url.Values{"current": {"1"}}).(map[string]any)
			if cur["scsi1"] != volid {
				t.Fatalf("scsi1 %v, want %s", cur["scsi1"], volid)
			}
			if seen := bf.byID["scsi1"] != ""; seen != tc.seen {
				t.Fatalf("guest sees the disk: %v, want %v", seen, tc.seen)
			}
			if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"delete": {"scsi1"}, "force": {"1"}}); st != "OK" {
				t.Fatalf("detach: %s", st)
			}
		})
	}
}

// TestSnapshotWithTransferDisk: a VM with a raw image of the dir storage
// plugged in cannot be snapshotted (has_feature "snapshot"); once the
// image is unplugged it can.
func TestSnapshotWithTransferDisk(t *testing.T) {
	e, _, volid := runningClone(t, nil)
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"scsi1": {volid + ",serial=abc"}}); st != "OK" {
		t.Fatalf("attach: %s", st)
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/snapshot", url.Values{"snapname": {"s1"}}); st != "snapshot feature is not available" {
		t.Fatalf("snapshot with the transfer disk plugged: %q", st)
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"delete": {"scsi1"}, "force": {"1"}}); st != "OK" {
		t.Fatalf("detach: %s", st)
	}
	if st := e.task("POST", "/nodes/pve/qemu/101/snapshot", url.Values{"snapname": {"s1"}}); st != "OK" {
		t.Fatalf("snapshot after the detach: %q", st)
	}
}

// pendingItemSchema is the item schema of GET .../pending in the official
// API extract (qemu-server vm_pending's returns).
func pendingItemSchema(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "apidata-extract.json"))
	if err != nil {
		t.Fatal(err)
	}
	var entries []struct {
		Path string `json:"path"`
		Info map[string]struct {
			Returns struct {
				Items map[string]any `json:"items"`
			} `json:"returns"`
		} `json:"info"`
	}
	if err := json.Unmarshal(raw, &entries); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Path == "/nodes/{node}/qemu/{vmid}/pending" {
			return e.Info["GET"].Returns.Items
		}
	}
	t.Fatal("no GET /nodes/{node}/qemu/{vmid}/pending in the extract")
	return nil
}

// checkPendingItems fails unless every item has only the schema's
// properties, of their types and ranges, and its required ones.
func checkPendingItems(t *testing.T, schema map[string]any, items []any) {
	t.Helper()
	props, _ := schema["properties"].(map[string]any)
	for _, it := range items {
		m, ok := it.(map[string]any)
		if !ok {
			t.Fatalf("item %v is not an object", it)
		}
		for name, p := range props {
			ps := p.(map[string]any)
			val, has := m[name]
			if !has {
				if ps["optional"] == nil {
					t.Errorf("item %v lacks required %s", m, name)
				}
				continue
			}
			switch ps["type"] {
			case "string":
				if _, ok := val.(string); !ok {
					t.Errorf("item %v: %s is %T, want a string", m, name, val)
				}
			case "integer":
				n, ok := val.(float64)
				if !ok || n != float64(int(n)) || (ps["minimum"] != nil && n < ps["minimum"].(float64)) || (ps["maximum"] != nil && n > ps["maximum"].(float64)) {
					t.Errorf("item %v: %s %v is not an integer in range", m, name, val)
				}
			}
		}
		for name := range m {
			if props[name] == nil {
				t.Errorf("item %v: %s is not in the schema", m, name)
			}
		}
	}
}

// pendingOf is GET .../pending as key -> item.
func pendingOf(e *env, schema map[string]any) map[string]map[string]any {
	items, _ := e.ok("GET", "/nodes/pve/qemu/101/pending", nil).([]any)
	checkPendingItems(e.t, schema, items)
	out := map[string]map[string]any{}
	for _, it := range items {
		m := it.(map[string]any)
		out[m["key"].(string)] = m
	}
	return out
}

// TestPendingAppliedAtStart: a disk left pending on a running VM without
// disk hotplug is attached at the next start (qemu-server vm_start_nolock
// runs vmconfig_apply_pending first), a pending forced deletion frees the
// volume at the next start, and GET .../pending shows both as qemu-server
// vm_pending does (key, value, pending, delete), within its schema.
func TestPendingAppliedAtStart(t *testing.T) {
	schema := pendingItemSchema(t)
	e, bf, volid := runningClone(t, url.Values{"hotplug": {"network,usb"}})
	val := volid + ",serial=abc"
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"scsi1": {val}}); st != "OK" {
		t.Fatalf("attach: %s", st)
	}
	p := pendingOf(e, schema)
	if it := p["scsi1"]; it == nil || it["pending"] != val || it["value"] != nil {
		t.Fatalf("pending scsi1: %v, want only a pending value %s", it, val)
	}
	if it := p["hotplug"]; it == nil || it["value"] != "network,usb" || it["pending"] != nil {
		t.Fatalf("pending hotplug: %v, want its current value only", it)
	}
	for _, step := range []string{"stop", "start"} {
		if st := e.task("POST", "/nodes/pve/qemu/101/status/"+step, nil); st != "OK" {
			t.Fatalf("%s: %s", step, st)
		}
	}
	if got := bf.byID["scsi1"]; got != "scsi-0QEMU_QEMU_HARDDISK_drive-scsi1" {
		t.Fatalf("after the start scsi1 is plugged as %q, want the drive-scsi1 name", got)
	}
	cur := e.ok("GET", "/nodes/pve/qemu/101/config", url.Values{"current": {"1"}}).(map[string]any)
	if cur["scsi1"] != val {
		t.Fatalf("current scsi1 after the start: %v, want %s", cur["scsi1"], val)
	}
	if it := pendingOf(e, schema)["scsi1"]; it["pending"] != nil || it["value"] != val {
		t.Fatalf("pending scsi1 after the start: %v, want applied", it)
	}

	// a forced deletion waits for the next start, then frees the volume
	if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"delete": {"scsi1"}, "force": {"1"}}); st != "OK" {
		t.Fatalf("detach: %s", st)
	}
	if it := pendingOf(e, schema)["scsi1"]; it["delete"] != float64(2) || it["value"] != val {
		t.Fatalf("pending scsi1 deletion: %v, want value %s and delete 2", it, val)
	}
	_, img, _, err := e.s.volumePath("", volid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img); err != nil {
		t.Fatalf("the image is gone before the next start: %v", err)
	}
	bf.mu.Lock()
	clear(bf.byID)
	bf.mu.Unlock()
	for _, step := range []string{"stop", "start"} {
		if st := e.task("POST", "/nodes/pve/qemu/101/status/"+step, nil); st != "OK" {
			t.Fatalf("%s: %s", step, st)
		}
	}
	if _, err := os.Stat(img); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the image after the start: %v, want it freed", err)
	}
	cur = e.ok("GET", "/nodes/pve/qemu/101/config", url.Values{"current": {"1"}}).(map[string]any)
	if cur["scsi1"] != nil || cur["unused0"] != nil || len(bf.byID) != 0 {
		t.Fatalf("after the start: scsi1 %v unused0 %v plugged %v, want none", cur["scsi1"], cur["unused0"], bf.byID)
	}
	if p := pendingOf(e, schema); p["scsi1"] != nil {
		t.Fatalf("pending after the start: %v", p["scsi1"])
	}
}

// TestSnapshotFreezesAgent: a snapshot of a running VM with the agent and
// freeze-fs on (the default) holds the agent in qemu-ga's frozen state
// while it runs: guest-exec gets qemu-ga's refusal, guest-ping and
// guest-fsfreeze-status answer; with freeze-fs=0 nothing is frozen, and
// after the snapshot the agent runs every command again.
func TestSnapshotFreezesAgent(t *testing.T) {
	for _, tc := range []struct {
		agent  string
		frozen bool
	}{{"1", true}, {"enabled=1,freeze-fs=0", false}, {"1,freeze-fs-on-backup=0", false}} {
		t.Run(tc.agent, func(t *testing.T) {
			e, bf, _ := runningClone(t, url.Values{"agent": {tc.agent}})
			sock := bf.AgentSocket(101)
			type answer struct {
				ret string
				err error
			}
			call := func(ctx context.Context, cmd string, args any) answer {
				ret, err := qgaClient{}.Call(ctx, sock, cmd, args)
				return answer{string(ret), err}
			}
			exec := map[string]any{"path": "true", "capture-output": true}
			got := map[string]answer{}
			ran := false
			e.s.snapshotFrozen = func(ctx context.Context, vmid int) {
				ran = true
				got["exec"] = call(ctx, "guest-exec", exec)
				got["ping"] = call(ctx, "guest-ping", nil)
				got["status"] = call(ctx, "guest-fsfreeze-status", nil)
			}
			if st := e.task("POST", "/nodes/pve/qemu/101/snapshot", url.Values{"snapname": {"s1"}}); st != "OK" {
				t.Fatalf("snapshot: %s", st)
			}
			if ran != tc.frozen {
				t.Fatalf("frozen during the snapshot: %v, want %v", ran, tc.frozen)
			}
			if tc.frozen {
				var ae *AgentError
				if !errors.As(got["exec"].err, &ae) || ae.Class != "CommandNotFound" || ae.Desc != "Command guest-exec has been disabled: the command is not allowed" {
					t.Errorf("guest-exec while frozen: %+v, want qemu-ga's refusal", got["exec"])
				}
				if got["ping"].err != nil || got["status"].err != nil || got["status"].ret != `"frozen"` {
					t.Errorf("while frozen: ping %+v, fsfreeze-status %+v; want both answered, frozen", got["ping"], got["status"])
				}
			}
			if a := call(context.Background(), "guest-exec", exec); a.err != nil {
				t.Errorf("guest-exec after the snapshot: %v", a.err)
			}
		})
	}
}
