package pveemu

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"testing"
)

// TestReviewImportRacesDestroy (review 48b): qemu-server create_vm runs
// create_disks (the import) inside lock_config_full($vmid, 1, ...): the
// VM's config flock is held for the whole import, so a destroy, even
// root's with skiplock=1, waits for the flock (lock_config: 10 s, then
// "can't lock file '/var/lock/qemu-server/lock-N.conf' - got timeout")
// and never sees a half-created VM. The emulator's create worker holds
// no lockVM while createDisks copies: a skiplock destroy runs meanwhile,
// deletes s.vms[vmid], and the create worker then dereferences the
// missing VM (v := s.vms[vmid]; v.conf[...]): the emulator panics.
func TestReviewImportRacesDestroy(t *testing.T) {
	e, _ := importEnv(t)
	big := filepath.Join(e.s.storageDir(), "import", "big.raw")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(768 << 20); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	upid := e.ok("POST", "/nodes/pve/qemu", url.Values{"vmid": {"100"}, "name": {"tpl"},
		"scsi0": {"local-lvm:0,import-from=local:import/big.raw"}}).(string)
	r := e.do("DELETE", "/nodes/pve/qemu/100", url.Values{"skiplock": {"1"}}, authTicket)
	if r.status == 200 {
		del, _ := r.body["data"].(string)
		t.Logf("destroy: %s", e.wait(del))
	}
	t.Logf("create: %s", e.wait(upid))
	// Proxmox: either the VM is whole (the destroy timed out on the
	// flock) or it was destroyed after the create; never a panic and
	// never a config without its imported disk.
	r = e.do("GET", "/nodes/pve/qemu/100/config", nil, authTicket)
	if r.status == 200 {
		if conf, _ := r.body["data"].(map[string]any); conf["scsi0"] == nil {
			t.Errorf("VM 100 without its imported disk: %v", conf)
		}
	}
}

// TestReviewUploadImportUnchecked (review 48b): pve-storage Status.pm
// upload's worker checks what it is about to put into import/ as
// download_url does: a given checksum ("checksum mismatch: got ...
// != expect ..."), an OVA's contents (assert_ova_contents), any other
// import image as untrusted in the format its extension names
// (file_size_info($tmpfilename, 10, $image_format, 1): a file that is no
// qcow2, or one with a backing file, fails the task). The emulator's
// upload copies any bytes under any import name and ignores checksum and
// checksum-algorithm.
func TestReviewUploadImportUnchecked(t *testing.T) {
	e := newEnv(t)
	e.s.SetStorageContent("local", "backup,iso,vztmpl,import")
	for _, tc := range []struct{ name, file string }{
		{"not a qcow2", "fake.qcow2"},
		{"an ova without an ovf", "empty.ova"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct, body := multipartUpload(t, "import", "filename", tc.file, []byte("just some bytes, not an image"))
			res, raw := e.post("/nodes/pve/storage/local/upload", ct, body)
			var ans struct {
				Data string `json:"data"`
			}
			if res.StatusCode != 200 || json.Unmarshal(raw, &ans) != nil {
				return // refused before the worker: fine
			}
			if st := e.wait(ans.Data); st == "OK" {
				t.Errorf("upload of %s (%s) to import/: task OK, want it failed", tc.file, tc.name)
			}
		})
	}
}
