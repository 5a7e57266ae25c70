package pveapi

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// handleImages serves the calls of a template build on the fake server
// (every request is checked against the schema before).
func (f *fakeServer) handleImages(op string, vmid int, p map[string]any) (any, int, string, bool) {
	switch op {
	case "POST /nodes/{node}/storage/{storage}/download-url":
		upid := f.task("download", fmt.Sprint(p["filename"]))
		if strings.Contains(fmt.Sprint(p["url"]), "bad") {
			// PVE::Tools download_file_from_url dies in the worker.
			f.tasks[upid] = fmt.Sprintf("checksum mismatch: got 'aa' != expect '%v'", p["checksum"])
			return upid, 0, "", true
		}
		f.imports = append(f.imports, map[string]any{"volid": fmt.Sprintf("%v:import/%v", p["storage"], p["filename"]), "content": "import", "format": "qcow2", "size": 3 << 30})
		return upid, 0, "", true
	case "GET /nodes/{node}/storage/{storage}/content":
		var out []map[string]any
		for _, v := range f.imports {
			if strings.HasPrefix(v["volid"].(string), fmt.Sprint(p["storage"])+":") && (p["content"] == nil || p["content"] == v["content"]) {
				out = append(out, v)
			}
		}
		return out, 0, "", true
	case "GET /storage":
		return []map[string]any{{"storage": "local-lvm", "type": "lvmthin", "content": "images,rootdir"},
			{"storage": "local", "type": "dir", "path": "/var/lib/vz", "content": "iso,snippets,import,vztmpl", "content-dirs": "snippets=cloud/snip", "digest": "x"}}, 0, "", true
	case "POST /nodes/{node}/qemu":
		if f.vms[vmid] != nil {
			return nil, 500, fmt.Sprintf("unable to create VM %d - VM %d already exists on node 'pve1'", vmid, vmid), true
		}
		c := map[string]any{"status": "stopped"}
		for k, v := range p {
			if k != "node" && k != "vmid" {
				c[k] = v
			}
		}
		f.vms[vmid] = c
		return f.task("qmcreate", strconv.Itoa(vmid)), 0, "", true
	case "POST /nodes/{node}/qemu/{vmid}/status/shutdown":
		f.vms[vmid]["status"] = "stopped"
		f.vms[vmid]["shutdown"] = fmt.Sprint(p["timeout"], ",", p["forceStop"])
		return f.task("qmshutdown", strconv.Itoa(vmid)), 0, "", true
	case "POST /nodes/{node}/qemu/{vmid}/template":
		if f.vms[vmid]["status"] != "stopped" {
			return nil, 500, "you can't convert a VM to template if VM is running", true
		}
		f.vms[vmid]["template"] = 1
		return f.task("qmtemplate", strconv.Itoa(vmid)), 0, "", true
	}
	return nil, 0, "", false
}

// TestImageCalls: a build's calls as the schema has them: download (its
// task's failure surfaced), list, storage config, create with import-from
// and a cloud-init drive, shutdown, conversion.
func TestImageCalls(t *testing.T) {
	f, c := newFakeServer(t)
	ctx := context.Background()
	sum := strings.Repeat("a", 128)
	vol, err := c.DownloadURL(ctx, "local", Download{URL: "https://h/d.qcow2", Content: "import", Filename: "d.qcow2", Checksum: sum, ChecksumAlgorithm: "sha512"})
	if err != nil || vol != "local:import/d.qcow2" {
		t.Fatalf("download: %q %v", vol, err)
	}
	_, err = c.DownloadURL(ctx, "local", Download{URL: "https://h/bad.qcow2", Content: "import", Filename: "bad.qcow2", Checksum: sum, ChecksumAlgorithm: "sha512"})
	if err == nil || !strings.Contains(err.Error(), "checksum mismatch: got 'aa' != expect '"+sum+"'") {
		t.Errorf("failed download: %v, want the task's exit status", err)
	}
	for _, d := range []Download{{URL: "u", Content: "import", Filename: "a/b.qcow2"}, {URL: "u", Content: "import", Filename: "b.qcow2", Checksum: "aa"}} {
		if _, err := c.DownloadURL(ctx, "local", d); err == nil {
			t.Errorf("%+v accepted", d)
		}
	}
	vols, err := c.StorageVolumes(ctx, "local", "import")
	if err != nil || len(vols) != 1 || vols[0].VolID != "local:import/d.qcow2" || vols[0].Size != 3<<30 {
		t.Errorf("volumes %+v %v", vols, err)
	}
	sc, err := c.Storage(ctx, "local")
	if err != nil || !sc.Has("snippets") || sc.Has("images") {
		t.Fatalf("storage %+v %v", sc, err)
	}
	if d, err := sc.Dir("snippets"); err != nil || d != "/var/lib/vz/cloud/snip" {
		t.Errorf("snippets dir %q %v (content-dirs override)", d, err)
	}
	if d, err := sc.Dir("import"); err != nil || d != "/var/lib/vz/import" {
		t.Errorf("import dir %q %v", d, err)
	}
	lvm, err := c.Storage(ctx, "local-lvm")
	if err != nil || lvm.Has("snippets") {
		t.Fatalf("storage %+v %v", lvm, err)
	}
	if _, err := lvm.Dir("snippets"); err == nil {
		t.Error("a storage without a path has a snippets dir")
	}
	if _, err := c.Storage(ctx, "nfs"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("unknown storage: %v", err)
	}
	conf := map[string]string{"name": "debian13", "scsi0": "local-lvm:0,import-from=local:import/d.qcow2", "ide2": "local-lvm:cloudinit",
		"cicustom": "user=local:snippets/u.yaml,network=local:snippets/n.yaml", "tags": "pvei-building", "net0": "virtio,bridge=vmbr0", "serial0": "socket", "vga": "serial0", "import-working-storage": "local"}
	if err := c.CreateVM(ctx, 150, conf); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateVM(ctx, 150, conf); !errors.Is(err, sandbox.ErrExists) {
		t.Errorf("second create: %v, want ErrExists", err)
	}
	if err := c.CreateVM(ctx, 151, map[string]string{"vmid": "1"}); err == nil {
		t.Error("vmid as a config key accepted")
	}
	if err := c.ConvertToTemplate(ctx, 150); err != nil {
		t.Fatal(err)
	}
	f.vms[150]["status"] = "running"
	f.vms[150]["template"] = 0
	if err := c.ShutdownVM(ctx, 150, 90*time.Second, true); err != nil || f.vms[150]["shutdown"] != "90,1" {
		t.Fatalf("shutdown: %v %v", err, f.vms[150]["shutdown"])
	}
	if err := c.ConvertToTemplate(ctx, 150); err != nil || f.vms[150]["template"] != 1 {
		t.Fatalf("template: %v", err)
	}
}
