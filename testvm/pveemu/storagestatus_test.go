package pveemu

import (
	"net/url"
	"syscall"
	"testing"
)

// TestStorageStatus: GET /nodes/{node}/storage/{storage}/status reports a
// storage's type, content, state and sizes: df of the data directory as
// pve-common's df reports it (Filesys::Df: used is blocks - bfree, so
// total - used - avail is what the file system reserves, not 0) unless
// SetStorageSpace says otherwise, and an inactive storage as
// storage_info leaves it (active 0, every size 0, in the node's list too);
// an unknown storage is the parameter exception "No such storage."; a
// token with neither Datastore.Audit nor Datastore.AllocateSpace on the
// storage is refused before the handler.
func TestStorageStatus(t *testing.T) {
	e := newEnv(t)
	st := e.ok("GET", "/nodes/pve/storage/local/status", nil).(map[string]any)
	if st["type"] != "dir" || st["active"] != float64(1) || st["enabled"] != float64(1) || st["content"] != "backup,iso,vztmpl" {
		t.Errorf("status of local: %v", st)
	}
	total, used, avail := st["total"].(float64), st["used"].(float64), st["avail"].(float64)
	if total <= 0 || avail <= 0 || avail > total || used <= 0 || used > total {
		t.Errorf("sizes of local: %v", st)
	}
	// the reserve (bfree - bavail) is the file system's, whatever is
	// written meanwhile
	var fs syscall.Statfs_t
	if err := syscall.Statfs(e.s.dataDir, &fs); err != nil {
		t.Fatal(err)
	}
	if reserved := float64((fs.Bfree - fs.Bavail) * uint64(fs.Frsize)); total-used-avail != reserved {
		t.Errorf("local: total %.0f - used %.0f - avail %.0f = %.0f, want the file system's reserved %.0f bytes (used = blocks - bfree)", total, used, avail, total-used-avail, reserved)
	}
	e.s.SetStorageSpace("local", StorageSpace{Total: 100 << 30, Avail: 3 << 30})
	st = e.ok("GET", "/nodes/pve/storage/local/status", nil).(map[string]any)
	if st["total"] != float64(100<<30) || st["avail"] != float64(3<<30) || st["used"] != float64(97<<30) {
		t.Errorf("status of local after SetStorageSpace: %v", st)
	}
	e.s.SetStorageSpace("local", StorageSpace{Total: 100 << 30, Used: 92 << 30, Avail: 3 << 30})
	st = e.ok("GET", "/nodes/pve/storage/local/status", nil).(map[string]any)
	if st["total"] != float64(100<<30) || st["avail"] != float64(3<<30) || st["used"] != float64(92<<30) {
		t.Errorf("status of local with 5 GiB reserved: %v", st)
	}
	e.s.SetStorageSpace("local", StorageSpace{Inactive: true})
	st = e.ok("GET", "/nodes/pve/storage/local/status", nil).(map[string]any)
	if st["active"] != float64(0) || st["enabled"] != float64(1) || st["total"] != float64(0) || st["used"] != float64(0) || st["avail"] != float64(0) {
		t.Errorf("status of an inactive local: %v", st)
	}
	list := e.ok("GET", "/nodes/pve/storage", url.Values{"storage": {"local"}}).([]any)
	if len(list) != 1 || list[0].(map[string]any)["active"] != float64(0) {
		t.Errorf("the node's storages with local inactive: %v", list)
	}
	if st := e.ok("GET", "/nodes/pve/storage/local-lvm/status", nil).(map[string]any); st["type"] != "lvmthin" || st["total"].(float64) <= 0 {
		t.Errorf("status of local-lvm: %v", st)
	}
	r := e.do("GET", "/nodes/pve/storage/nfs1/status", nil, authTicket)
	if r.status != 400 || r.errors()["storage"] != "No such storage." {
		t.Errorf("unknown storage: %d %q %v", r.status, r.reason, r.body)
	}

	if err := e.s.AddUser("agent@pve", "pw"); err != nil {
		t.Fatal(err)
	}
	tokID, secret, err := e.s.AddToken("agent@pve", "daemon", false)
	if err != nil {
		t.Fatal(err)
	}
	token := "PVEAPIToken=" + tokID + "=" + secret
	r = e.do("GET", "/nodes/pve/storage/local/status", nil, authNone, "Authorization", token)
	if r.status != 403 || r.reason != "Permission check failed (/storage/local, Datastore.Audit|Datastore.AllocateSpace)" {
		t.Errorf("a token without privileges on the storage: %d %q", r.status, r.reason)
	}
	if err := e.s.SetACL("/storage/local", "agent@pve", "PVEDatastoreUser", false); err != nil {
		t.Fatal(err)
	}
	r = e.do("GET", "/nodes/pve/storage/local/status", url.Values{}, authNone, "Authorization", token)
	if r.status != 200 {
		t.Errorf("a token with Datastore.AllocateSpace on the storage: %d %q", r.status, r.reason)
	}
}
