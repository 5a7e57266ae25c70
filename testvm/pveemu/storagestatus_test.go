package pveemu

import (
	"net/url"
	"testing"
)

// TestStorageStatus: GET /nodes/{node}/storage/{storage}/status reports a
// storage's type, content, state and sizes (df of the data directory
// unless SetStorageSpace says otherwise, used = total - avail); an
// unknown storage is the parameter exception "No such storage."; a token
// with neither Datastore.Audit nor Datastore.AllocateSpace on the
// storage is refused before the handler.
func TestStorageStatus(t *testing.T) {
	e := newEnv(t)
	st := e.ok("GET", "/nodes/pve/storage/local/status", nil).(map[string]any)
	if st["type"] != "dir" || st["active"] != float64(1) || st["enabled"] != float64(1) || st["content"] != "backup,iso,vztmpl" {
		t.Errorf("status of local: %v", st)
	}
	total, avail := st["total"].(float64), st["avail"].(float64)
	if total <= 0 || avail <= 0 || avail > total || st["used"].(float64) != total-avail {
		t.Errorf("sizes of local: %v", st)
	}
	e.s.SetStorageSpace("local", StorageSpace{Total: 100 << 30, Avail: 3 << 30})
	st = e.ok("GET", "/nodes/pve/storage/local/status", nil).(map[string]any)
	if st["total"] != float64(100<<30) || st["avail"] != float64(3<<30) || st["used"] != float64(97<<30) {
		t.Errorf("status of local after SetStorageSpace: %v", st)
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
