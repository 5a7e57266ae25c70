package pveemu

import (
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/pveapi/access"
)

// TestDoctorReads covers the reads of pve-inspectd doctor: a token's own
// effective permissions, the storage.cfg sections and the node's
// storages, each limited to what the caller may see.
func TestDoctorReads(t *testing.T) {
	e := newEnv(t)
	id, secret, err := e.s.ApplyAccessSetup(AccessSetup{Templates: []int{templateID}, Transfer: access.TransferStorage})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.s.AddUser("nobody@pve", ""); err != nil {
		t.Fatal(err)
	}
	nid, nsecret, err := e.s.AddToken("nobody@pve", "tok", true)
	if err != nil {
		t.Fatal(err)
	}
	as := func(id, secret, path string, form url.Values) resp {
		t.Helper()
		return e.do("GET", path, form, authNone, "Authorization", "PVEAPIToken="+id+"="+secret)
	}
	data := func(r resp) any {
		t.Helper()
		if r.status != 200 {
			t.Fatalf("%d %s %v", r.status, r.reason, r.body)
		}
		return r.body["data"]
	}
	privs := func(d any, path string) []string {
		m, _ := d.(map[string]any)
		p, _ := m[path].(map[string]any)
		var out []string
		for k := range p {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}

	for _, tc := range []struct {
		path string
		want []string
		not  []string
	}{
		{"/pool/" + access.DefaultPool, []string{"VM.Config.HWType", "VM.Config.CDROM", "VM.Allocate", "Datastore.AllocateSpace"}, []string{"Datastore.Allocate", "Sys.Modify"}},
		{"/storage/local", []string{"Datastore.Allocate", "Datastore.AllocateSpace"}, nil},
		{"/storage/local-lvm", []string{"Datastore.AllocateSpace"}, []string{"Datastore.Allocate"}},
		{"/vms/9000", []string{"VM.Clone", "VM.Audit"}, []string{"VM.Config.Disk"}},
		{"/nodes/pve", []string{"Sys.Modify"}, nil},
		{"/", []string{"Sys.Audit"}, []string{"Sys.Modify"}},
	} {
		got := privs(data(as(id, secret, "/access/permissions", url.Values{"path": {tc.path}})), tc.path)
		for _, p := range tc.want {
			if !slices.Contains(got, p) {
				t.Errorf("%s: %v lacks %s", tc.path, got, p)
			}
		}
		for _, p := range tc.not {
			if slices.Contains(got, p) {
				t.Errorf("%s: %v has %s", tc.path, got, p)
			}
		}
	}
	// Without a path: the top-level paths, the ACL paths and the pool's
	// members, those with privileges only.
	all, _ := data(as(id, secret, "/access/permissions", nil)).(map[string]any)
	for _, p := range []string{"/", "/sdn", "/pool/pve-inspect", "/storage/local-lvm", "/storage/local", "/vms/9000", "/nodes/pve"} {
		if _, ok := all[p]; !ok {
			t.Errorf("permissions without path lack %s: %v", p, all)
		}
	}
	if _, ok := all["/access"]; ok {
		t.Errorf("a path without privileges is listed: %v", all["/access"])
	}
	// Another's permissions need Sys.Audit on /access; root has it.
	if r := as(id, secret, "/access/permissions", url.Values{"userid": {"root@pam"}}); r.status != 403 {
		t.Errorf("the token read root's permissions: %d", r.status)
	}
	if got := privs(e.ok("GET", "/access/permissions", url.Values{"userid": {id}, "path": {"/storage/local"}}), "/storage/local"); !slices.Contains(got, "Datastore.Allocate") {
		t.Errorf("root reading the token's permissions: %v", got)
	}

	// storage.cfg: both storages for the token, none for nobody.
	list, _ := data(as(id, secret, "/storage", nil)).([]any)
	byID := map[string]map[string]any{}
	for _, x := range list {
		m := x.(map[string]any)
		byID[m["storage"].(string)] = m
	}
	if l := byID["local"]; l == nil || l["type"] != "dir" || l["content"] != "backup,iso,vztmpl" || !strings.HasSuffix(l["path"].(string), "/storage/local") {
		t.Errorf("local: %v", l)
	}
	if l := byID["local-lvm"]; l == nil || l["type"] != "lvmthin" || l["vgname"] != "pve" || l["content"] != "images,rootdir" {
		t.Errorf("local-lvm: %v", l)
	}
	if l, _ := data(as(nid, nsecret, "/storage", nil)).([]any); len(l) != 0 {
		t.Errorf("a token without privileges sees %v", l)
	}
	e.s.SetStorageContent("local", "backup,images,iso,vztmpl")
	if l, _ := data(as(id, secret, "/storage", url.Values{"type": {"dir"}})).([]any); len(l) != 1 || l[0].(map[string]any)["content"] != "backup,images,iso,vztmpl" {
		t.Errorf("local after SetStorageContent, type=dir: %v", l)
	}
	// The node's storages: active, filtered by content.
	ns, _ := data(as(id, secret, "/nodes/pve/storage", url.Values{"content": {"rootdir"}})).([]any)
	if len(ns) != 1 || ns[0].(map[string]any)["storage"] != "local-lvm" || ns[0].(map[string]any)["active"] != float64(1) {
		t.Errorf("node storages with rootdir: %v", ns)
	}

	// The transfer storage's images: a volume left by VM 100 is listed for
	// the token (Datastore.Allocate on local), filtered by vmid; a caller
	// without privileges on the storage is refused.
	r := e.do("POST", "/nodes/pve/storage/local/content", url.Values{"vmid": {"100"}, "filename": {"vm-100-disk-9.raw"}, "size": {"1M"}},
		authNone, "Authorization", "PVEAPIToken="+id+"="+secret)
	if r.status != 200 {
		t.Fatalf("alloc: %d %v", r.status, r.body)
	}
	vols, _ := data(as(id, secret, "/nodes/pve/storage/local/content", url.Values{"vmid": {"100"}})).([]any)
	if len(vols) != 1 || vols[0].(map[string]any)["volid"] != "local:100/vm-100-disk-9.raw" {
		t.Errorf("content of local for VM 100: %v", vols)
	}
	if vols, _ := data(as(id, secret, "/nodes/pve/storage/local/content", url.Values{"vmid": {"101"}})).([]any); len(vols) != 0 {
		t.Errorf("content of local for VM 101: %v", vols)
	}
	if r := as(nid, nsecret, "/nodes/pve/storage/local/content", nil); r.status != 403 {
		t.Errorf("content of local without privileges: %d %v", r.status, r.body)
	}
}

// TestStoragePathReported: with Options.StoragePath the dir storage's
// storage.cfg path and each volume's path are where the client has the
// emulator's directory mounted (a real node's /var/lib/vz), while the
// image itself is in DataDir.
func TestStoragePathReported(t *testing.T) {
	e := newEnv(t)
	e.s.storagePath = "/var/lib/vz"
	volid, _ := e.ok("POST", "/nodes/pve/storage/local/content", url.Values{"filename": {"vm-101-x.raw"}, "vmid": {"101"}, "size": {"4096"}, "format": {"raw"}}).(string)
	if volid != "local:101/vm-101-x.raw" {
		t.Fatalf("volid %q", volid)
	}
	info, _ := e.ok("GET", "/nodes/pve/storage/local/content/"+url.PathEscape(volid), nil).(map[string]any)
	if got := info["path"]; got != "/var/lib/vz/images/101/vm-101-x.raw" {
		t.Errorf("volume path %v, want it under /var/lib/vz", got)
	}
	if _, err := os.Stat(filepath.Join(e.s.storageDir(), "images", "101", "vm-101-x.raw")); err != nil {
		t.Errorf("the image is not in the emulator's directory: %v", err)
	}
	cfgPath := func() any {
		list, _ := e.ok("GET", "/storage", nil).([]any)
		for _, c := range list {
			if m, _ := c.(map[string]any); m["storage"] == "local" {
				return m["path"]
			}
		}
		t.Fatalf("GET /storage has no local: %v", list)
		return nil
	}
	if got := cfgPath(); got != "/var/lib/vz" {
		t.Errorf("storage.cfg path %v, want /var/lib/vz", got)
	}
	e.s.storagePath = ""
	if got := cfgPath(); got != e.s.storageDir() {
		t.Errorf("without StoragePath the path is %v, want %s", got, e.s.storageDir())
	}
}

// TestFreeVolumeTask: DELETE .../content/{volume} answers a UPID whose id
// is "[<owner>@]<storage>" (pve-storage Content.pm delete), so a client
// reads its status by the UPID; a volume id in it would put ':' and '/'
// into the UPID, which upid_decode rejects and no route matches.
func TestFreeVolumeTask(t *testing.T) {
	e := newEnv(t)
	volid, _ := e.ok("POST", "/nodes/pve/storage/local/content", url.Values{"filename": {"vm-101-x.raw"}, "vmid": {"101"}, "size": {"4096"}, "format": {"raw"}}).(string)
	upid, _ := e.ok("DELETE", "/nodes/pve/storage/local/content/"+url.PathEscape(volid), nil).(string)
	if f := strings.Split(upid, ":"); len(f) != 9 || f[5] != "imgdel" || f[6] != "101@local" {
		t.Fatalf("UPID %q, want the id 101@local", upid)
	}
	e.wait(upid)
	st, _ := e.ok("GET", "/nodes/pve/tasks/"+url.PathEscape(upid)+"/status", nil).(map[string]any)
	if st["status"] != "stopped" || st["exitstatus"] != "OK" || st["id"] != "101@local" {
		t.Fatalf("task status %v", st)
	}
}

// TestContentListFollowsConfiguredTypes: pve-storage's volume_list lists
// only the content types the storage is configured for; a VM image in
// the images directory of a storage without "images" (a fresh node's
// "local") is not listed, whatever is asked, until the storage gets that
// content type.
func TestContentListFollowsConfiguredTypes(t *testing.T) {
	e := newEnv(t)
	e.setupZone()
	if st := e.task("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"100"}}); st != "OK" {
		t.Fatalf("clone: %s", st)
	}
	content := "/nodes/pve/storage/local/content"
	volid, _ := e.ok("POST", content, url.Values{"filename": {"vm-100-pvei-leak.raw"}, "vmid": {"100"}, "size": {"1024"}, "format": {"raw"}}).(string)
	if volid == "" {
		t.Fatal("no volume allocated")
	}
	listed := func(q url.Values) bool {
		for _, x := range e.ok("GET", content, q).([]any) {
			if x.(map[string]any)["volid"] == volid {
				return true
			}
		}
		return false
	}
	for _, q := range []url.Values{nil, {"content": {"images"}}, {"vmid": {"100"}}} {
		if listed(q) {
			t.Errorf("listed %v on local without images content", q)
		}
	}
	e.s.SetStorageContent("local", "backup,images,iso,vztmpl")
	for _, q := range []url.Values{nil, {"content": {"images"}}, {"vmid": {"100"}}} {
		if !listed(q) {
			t.Errorf("not listed %v once local has images", q)
		}
	}
}
