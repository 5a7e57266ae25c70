package pveemu

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCreateHoldsConfigLockAgainstDestroy: qemu-server create_vm runs
// create_disks (the import) inside lock_config_full($vmid, 1, ...): the
// VM's config flock is held for the whole import, so a destroy, even
// root's with skiplock=1, waits for the flock (lock_config: 10 s, then
// "can't lock file '/var/lock/qemu-server/lock-N.conf' - got timeout")
// and never sees a half-created VM.
func TestCreateHoldsConfigLockAgainstDestroy(t *testing.T) {
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

// TestUploadChecksImport: pve-storage Status.pm upload's worker checks
// what it is about to put into import/ as download_url does: a given
// checksum ("checksum mismatch: got ... != expect ..."), an OVA's
// contents (assert_ova_contents), any other import image as untrusted in
// the format its extension names (file_size_info($tmpfilename, 10,
// $image_format, 1): a file that is no qcow2 fails the task).
func TestUploadChecksImport(t *testing.T) {
	e := newEnv(t)
	e.s.SetStorageContent("local", "backup,iso,vztmpl,import")
	bytesRaw := []byte("just some bytes, not an image")
	sum := sha256.Sum256(bytesRaw)
	for _, tc := range []struct {
		name, file, query string
		ok                bool
	}{
		{"not a qcow2", "fake.qcow2", "", false},
		{"an ova without an ovf", "empty.ova", "", false},
		{"a raw with another checksum", "ok.raw", "?checksum-algorithm=sha256&checksum=" + strings.Repeat("0", 64), false},
		{"a raw with its checksum", "ok.raw", "?checksum-algorithm=sha256&checksum=" + hex.EncodeToString(sum[:]), true},
		{"a raw", "ok2.raw", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct, body := multipartUpload(t, "import", "filename", tc.file, bytesRaw)
			res, raw := e.post("/nodes/pve/storage/local/upload"+tc.query, ct, body)
			var ans struct {
				Data string `json:"data"`
			}
			if res.StatusCode != 200 || json.Unmarshal(raw, &ans) != nil {
				if tc.ok {
					t.Fatalf("upload of %s refused: %s %s", tc.file, res.Status, raw)
				}
				return // refused before the worker: fine
			}
			if st := e.wait(ans.Data); (st == "OK") != tc.ok {
				t.Errorf("upload of %s (%s) to import/: task %s, want OK %v", tc.file, tc.name, st, tc.ok)
			}
			_, err := os.Stat(filepath.Join(e.s.storageDir(), "import", tc.file))
			if (err == nil) != tc.ok {
				t.Errorf("import/%s on the storage: %v, want %v", tc.file, err == nil, tc.ok)
			}
		})
	}
}

// TestUploadOverwritesInPlace: pve-storage Status.pm upload's worker
// copies with `cp -- $tmpfilename $dest` ("we simply overwrite the
// destination file if it already exists"): the existing file is written
// in place, not replaced by a rename, so a reader that had it open reads
// the new upload's bytes (and one reading during the copy a mix): two
// uploads of one name at once share one file.
func TestUploadOverwritesInPlace(t *testing.T) {
	e := newEnv(t)
	e.s.SetStorageContent("local", "backup,iso,vztmpl,import")
	put := func(data string) {
		t.Helper()
		ct, body := multipartUpload(t, "import", "filename", "same.raw", []byte(data))
		res, raw := e.post("/nodes/pve/storage/local/upload", ct, body)
		var ans struct {
			Data string `json:"data"`
		}
		if res.StatusCode != 200 || json.Unmarshal(raw, &ans) != nil {
			t.Fatalf("upload: %s %s", res.Status, raw)
		}
		if st := e.wait(ans.Data); st != "OK" {
			t.Fatalf("upload task: %s", st)
		}
	}
	put("first upload")
	f, err := os.Open(filepath.Join(e.s.storageDir(), "import", "same.raw"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	put("second upload")
	got := make([]byte, 64)
	n, _ := f.ReadAt(got, 0)
	if string(got[:n]) != "second upload" {
		t.Errorf("the first file's reader reads %q: want the second upload, written in place", got[:n])
	}
}
