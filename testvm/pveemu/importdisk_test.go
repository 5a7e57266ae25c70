package pveemu

import (
	"bytes"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// importEnv is an emulator whose local storage holds images, imports and
// snippets, with a qcow2 cloud image, a raw image and an OVA in import/.
func importEnv(t *testing.T) (*env, []byte) {
	t.Helper()
	e := newEnv(t)
	e.s.SetStorageContent("local", "backup,iso,vztmpl,import,images,snippets")
	img := qcow2Image(2 << 30)
	files := map[string][]byte{
		"import/cloud.qcow2": img,
		"import/disk.raw":    bytes.Repeat([]byte{7}, 3<<20),
		"import/fake.qcow2":  []byte("not a qcow2 at all"),
		"import/app.ova":     ovaImage(t, map[string][]byte{"app.ovf": []byte("<ovf/>"), "disk1.vmdk": vmdkImage(1 << 30)}),
		"template/iso/x.iso": []byte("iso"),
		"snippets/user.yaml": []byte("#cloud-config\n"),
	}
	for name, b := range files {
		p := filepath.Join(e.s.storageDir(), name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return e, img
}

func (e *env) config(vmid string) map[string]any {
	e.t.Helper()
	m, _ := e.ok("GET", "/nodes/pve/qemu/"+vmid+"/config", nil).(map[string]any)
	return m
}

// TestImportFromOnCreate: a VM created from a cloud image the way the
// reference plugin and `pve-inspectd template build` do it: the disk's
// new volume holds the image's bytes and records its virtual size, the
// cloud-init drive is vm-<vmid>-cloudinit.
func TestImportFromOnCreate(t *testing.T) {
	e, img := importEnv(t)
	upid := e.ok("POST", "/nodes/pve/qemu", url.Values{"vmid": {"100"}, "name": {"tpl"},
		"scsi0": {"local:0,import-from=local:import/cloud.qcow2,format=qcow2,cache=writeback"},
		"ide2":  {"local:cloudinit"}, "scsihw": {"virtio-scsi-single"}, "cicustom": {"user=local:snippets/user.yaml"}}).(string)
	if st := e.wait(upid); st != "OK" {
		t.Fatalf("create: %s\n%s", st, e.taskLog(upid))
	}
	conf := e.config("100")
	if conf["scsi0"] != "local:100/vm-100-disk-0.qcow2,cache=writeback,size=2G" || conf["ide2"] != "local:100/vm-100-cloudinit.qcow2,media=cdrom" {
		t.Fatalf("config: scsi0 %q ide2 %q", conf["scsi0"], conf["ide2"])
	}
	log := e.taskLog(upid)
	if !strings.Contains(log, "scsi0: successfully created disk 'local:100/vm-100-disk-0.qcow2,cache=writeback,size=2G'") ||
		!strings.Contains(log, "ide2: successfully created disk 'local:100/vm-100-cloudinit.qcow2,media=cdrom'") {
		t.Fatalf("log:\n%s", log)
	}
	got, err := os.ReadFile(filepath.Join(e.s.storageDir(), "images", "100", "vm-100-disk-0.qcow2"))
	if err != nil || !bytes.Equal(got, img) {
		t.Fatalf("imported bytes: %v", err)
	}
	info, _ := e.ok("GET", "/nodes/pve/storage/local/content/local:100/vm-100-disk-0.qcow2", nil).(map[string]any)
	if info["format"] != "qcow2" || info["size"] != float64(2<<30) {
		t.Fatalf("volume info: %v", info)
	}
	list, _ := e.ok("GET", "/nodes/pve/storage/local/content", url.Values{"content": {"images"}}).([]any)
	if len(list) != 2 {
		t.Fatalf("images listed: %v", list)
	}
	if st := e.task("POST", "/nodes/pve/qemu/100/status/start", nil); st != "OK" {
		t.Fatalf("start with a present snippet: %s", st)
	}
	if st := e.task("POST", "/nodes/pve/qemu/100/status/stop", nil); st != "OK" {
		t.Fatalf("stop: %s", st)
	}
	if st := e.task("DELETE", "/nodes/pve/qemu/100", nil); st != "OK" {
		t.Fatalf("destroy: %s", st)
	}
	if names := leftovers(t, filepath.Join(e.s.storageDir(), "images", "100")); len(names) != 0 {
		t.Fatalf("destroy left %v", names)
	}
}

func TestImportFromVariants(t *testing.T) {
	e, _ := importEnv(t)
	for _, c := range []struct {
		name, vmid string
		form       url.Values
		want       map[string]string
	}{
		{"raw to the thin pool", "101", url.Values{"scsi0": {"local-lvm:0,import-from=local:import/disk.raw"}, "ide2": {"local-lvm:cloudinit"}},
			map[string]string{"scsi0": "local-lvm:vm-101-disk-0,size=3M", "ide2": "local-lvm:vm-101-cloudinit,media=cdrom"}},
		{"an OVA's member: extracted to disk-0, imported to disk-1, disk-0 freed", "102", url.Values{"scsi0": {"local:0,import-from=local:import/app.ova/disk1.vmdk,format=qcow2"}},
			map[string]string{"scsi0": "local:102/vm-102-disk-1.vmdk,size=1G"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.form.Set("vmid", c.vmid)
			upid := e.ok("POST", "/nodes/pve/qemu", c.form).(string)
			if st := e.wait(upid); st != "OK" {
				t.Fatalf("create: %s\n%s", st, e.taskLog(upid))
			}
			conf := e.config(c.vmid)
			for k, v := range c.want {
				if conf[k] != v {
					t.Errorf("%s: %q, want %q", k, conf[k], v)
				}
			}
		})
	}
	if names := leftovers(t, filepath.Join(e.s.storageDir(), "images", "102")); len(names) != 1 || names[0] != "vm-102-disk-1.vmdk" {
		t.Fatalf("OVA extraction left %v", names)
	}
	list, _ := e.ok("GET", "/nodes/pve/storage/local-lvm/content", url.Values{"vmid": {"101"}}).([]any)
	if len(list) != 2 {
		t.Fatalf("thin volumes of 101: %v", list)
	}

	t.Run("config update", func(t *testing.T) {
		upid := e.ok("POST", "/nodes/pve/qemu/101/config", url.Values{"scsi1": {"local:0,import-from=local:import/cloud.qcow2"}}).(string)
		if st := e.wait(upid); st != "OK" {
			t.Fatalf("update: %s", st)
		}
		if conf := e.config("101"); conf["scsi1"] != "local:101/vm-101-disk-0.qcow2,size=2G" {
			t.Fatalf("scsi1: %q", conf["scsi1"])
		}
		if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"ide0": {"local:cloudinit"}}); !strings.Contains(st, "ide0 - cloud-init drive is already attached at 'ide2'") {
			t.Fatalf("second cloud-init drive: %s", st)
		}
		if names := leftovers(t, filepath.Join(e.s.storageDir(), "images", "101")); len(names) != 1 {
			t.Fatalf("refused cloud-init drive left %v", names)
		}
	})
}

func TestImportFromRefusals(t *testing.T) {
	e, _ := importEnv(t)
	t.Run("before the worker", func(t *testing.T) {
		for _, c := range []struct {
			name, scsi0   string
			status        int
			reason, field string
		}{
			{"a size with import-from", "local:8,import-from=local:import/cloud.qcow2", 400, "", "'import-from' requires special syntax - use <storage ID>:0,import-from=<source>"},
			{"an iso source", "local:0,import-from=local:iso/x.iso", 400, "", "local:iso/x.iso has wrong type 'iso' - needs to be 'images' or 'import'"},
			{"an unparsable source", "local:0,import-from=local:import/x.txt", 500, "unable to parse directory volume name 'import/x.txt'", ""},
			{"a missing storage", "nfs:0,import-from=local:import/cloud.qcow2", 500, "storage 'nfs' does not exist", ""},
		} {
			t.Run(c.name, func(t *testing.T) {
				r := e.do("POST", "/nodes/pve/qemu", url.Values{"vmid": {"110"}, "scsi0": {c.scsi0}}, authTicket)
				if r.status != c.status || c.reason != "" && r.reason != c.reason || c.field != "" && r.errors()["scsi0"] != c.field {
					t.Fatalf("%d %q %v", r.status, r.reason, r.errors())
				}
			})
		}
	})
	t.Run("a storage without images", func(t *testing.T) {
		e.s.SetStorageContent("local-lvm", "rootdir")
		defer e.s.SetStorageContent("local-lvm", "images,rootdir")
		r := e.do("POST", "/nodes/pve/qemu", url.Values{"vmid": {"110"}, "scsi0": {"local-lvm:0,import-from=local:import/cloud.qcow2"}}, authTicket)
		if r.status != 400 || r.errors()["storage"] != "storage 'local-lvm' does not support vm images" {
			t.Fatalf("%d %q %v", r.status, r.reason, r.errors())
		}
	})
	t.Run("in the worker: the VM goes", func(t *testing.T) {
		for _, c := range []struct{ name, scsi0, want string }{
			{"a missing import volume", "local:0,import-from=local:import/missing.qcow2", "unable to create VM 111 - failed to stat '" + filepath.Join(e.s.storageDir(), "import", "missing.qcow2") + "'"},
			{"an import volume not in its format", "local:0,import-from=local:import/fake.qcow2", "Image is not in qcow2 format"},
			{"a missing image of another VM", "local:0,import-from=local:9/vm-9-disk-0.raw", "cannot import from 'local:9/vm-9-disk-0.raw' - could not get size of local:9/vm-9-disk-0.raw"},
			{"a missing file", "local:0,import-from=/nonexistent.qcow2", "can't find file '/nonexistent.qcow2'"},
		} {
			t.Run(c.name, func(t *testing.T) {
				st := e.task("POST", "/nodes/pve/qemu", url.Values{"vmid": {"111"}, "scsi0": {c.scsi0}, "ide2": {"local:cloudinit"}})
				if !strings.Contains(st, c.want) {
					t.Fatalf("exit status %q, want %q", st, c.want)
				}
				if r := e.do("GET", "/nodes/pve/qemu/111/config", nil, authTicket); r.status != 500 {
					t.Fatalf("the VM stayed: %d", r.status)
				}
				if names := leftovers(t, filepath.Join(e.s.storageDir(), "images", "111")); len(names) != 0 {
					t.Fatalf("left %v", names)
				}
			})
		}
	})
}

// TestImportFromPermissions: the source's privileges for a token of
// pve-access-setup's role (Datastore.AllocateSpace and Datastore.Audit on
// the pool's storages, VM.Allocate on the pool): an import volume needs
// either on its storage; an absolute path is root@pam's alone; another
// VM's image needs VM.Clone on it.
func TestImportFromPermissions(t *testing.T) {
	e, _ := importEnv(t)
	id, secret, err := e.s.ApplyAccessSetup(AccessSetup{Templates: []int{templateID}, Storages: []string{"local"}})
	if err != nil {
		t.Fatal(err)
	}
	auth := []string{"Authorization", "PVEAPIToken=" + id + "=" + secret}
	create := func(vmid, scsi0 string) resp {
		return e.do("POST", "/nodes/pve/qemu", url.Values{"vmid": {vmid}, "pool": {"pve-inspect"}, "scsi0": {scsi0}}, authNone, auth...)
	}
	r := create("120", "local:0,import-from=local:import/cloud.qcow2")
	if r.status != 200 {
		t.Fatalf("import volume with the pool's storage grants: %d %q", r.status, r.reason)
	}
	if st := e.wait(r.body["data"].(string)); st != "OK" {
		t.Fatalf("create: %s", st)
	}
	if r := create("121", "local:0,import-from="+filepath.Join(e.s.storageDir(), "import", "cloud.qcow2")); r.status != 500 || r.reason != "Only root can pass arbitrary filesystem paths." {
		t.Fatalf("absolute path: %d %q", r.status, r.reason)
	}
	if r := create("122", "local:0,import-from=local:120/vm-120-disk-0.qcow2"); r.status != 403 || !strings.Contains(r.reason, "/vms/120, VM.Clone") {
		t.Fatalf("another VM's image: %d %q", r.status, r.reason)
	}
	if r := create("123", "local-lvm:0,import-from=local:import/cloud.qcow2"); r.status != 403 || !strings.Contains(r.reason, "/storage/local-lvm, Datastore.AllocateSpace") {
		t.Fatalf("a storage outside the pool: %d %q", r.status, r.reason)
	}
}

// TestCicustomAtStart: cicustom is checked when the start generates the
// cloud-init drive: a missing snippet and a volume that is not a snippet
// fail the start.
func TestCicustomAtStart(t *testing.T) {
	e, _ := importEnv(t)
	if st := e.task("POST", "/nodes/pve/qemu", url.Values{"vmid": {"130"}, "ide2": {"local:cloudinit"}}); st != "OK" {
		t.Fatalf("create: %s", st)
	}
	for _, c := range []struct{ cicustom, want string }{
		{"user=local:snippets/missing.yaml", "can't find file 'local:snippets/missing.yaml'"},
		{"user=local:iso/x.iso", "local:iso/x.iso is not in the snippets directory"},
	} {
		if st := e.task("POST", "/nodes/pve/qemu/130/config", url.Values{"cicustom": {c.cicustom}}); st != "OK" {
			t.Fatalf("set cicustom: %s", st)
		}
		if st := e.task("POST", "/nodes/pve/qemu/130/status/start", nil); st != c.want {
			t.Fatalf("start with %s: %q, want %q", c.cicustom, st, c.want)
		}
	}
}
