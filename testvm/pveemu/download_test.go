package pveemu

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// qcow2Image is a qcow2 header of virtual size size (what probeImage
// reads), padded to 4 KiB.
func qcow2Image(size uint64) []byte { return CloudQCOW2(size) }

// qcow2WithBacking is a qcow2 header naming a backing file.
func qcow2WithBacking(name string) []byte {
	b := qcow2Image(1 << 20)
	binary.BigEndian.PutUint64(b[8:], 512)
	binary.BigEndian.PutUint32(b[16:], uint32(len(name)))
	copy(b[512:], name)
	return b
}

// vmdkImage is a monolithic sparse vmdk header of size bytes.
func vmdkImage(size uint64) []byte {
	b := make([]byte, 1024)
	copy(b, vmdkMagic)
	binary.LittleEndian.PutUint32(b[4:], 1)
	binary.LittleEndian.PutUint64(b[12:], size/512)
	return b
}

// ovaImage is a tar with the given members.
func ovaImage(t *testing.T, members map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range sortedKeys(members) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(members[name])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(members[name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// fileServer serves files by path; a missing one is 404.
func fileServer(t *testing.T, files map[string][]byte) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	}))
	t.Cleanup(ts.Close)
	return ts
}

// taskLog is the task's log text.
func (e *env) taskLog(upid string) string {
	e.t.Helper()
	lines, _ := e.ok("GET", "/nodes/pve/tasks/"+url.PathEscape(upid)+"/log", url.Values{"limit": {"1000"}}).([]any)
	var out []string
	for _, l := range lines {
		m, _ := l.(map[string]any)
		s, _ := m["t"].(string)
		out = append(out, s)
	}
	return strings.Join(out, "\n")
}

// importDir is the dir storage's import directory.
func (e *env) importDir() string { return filepath.Join(e.s.storageDir(), "import") }

// leftovers are the files of dir (the destination and temporary files).
func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	files, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		out = append(out, f.Name())
	}
	return out
}

func TestDownloadURL(t *testing.T) {
	img := qcow2Image(2 << 30)
	srv := fileServer(t, map[string][]byte{
		"/cloud.qcow2":  img,
		"/notqcow.raw":  []byte("raw bytes"),
		"/bad.ova":      ovaImage(t, map[string][]byte{"disk.vmdk": vmdkImage(1 << 20)}),
		"/good.ova":     ovaImage(t, map[string][]byte{"x.ovf": []byte("<ovf/>"), "disk.vmdk": vmdkImage(1 << 20)}),
		"/plain.iso":    []byte("an iso"),
		"/backing.img":  qcow2WithBacking("base.qcow2"),
		"/notqcow.text": []byte("not a qcow2"),
	})
	e := newEnv(t)
	e.s.SetStorageContent("local", "backup,iso,vztmpl,import,images,snippets")
	dl := "/nodes/pve/storage/local/download-url"

	t.Run("success", func(t *testing.T) {
		upid := e.ok("POST", dl, url.Values{"content": {"import"}, "filename": {"../x/Cloud Image.qcow2"}, "url": {srv.URL + "/cloud.qcow2"},
			"checksum": {sha256Hex(img)}, "checksum-algorithm": {"sha256"}}).(string)
		_, _, _, _, typ, id, _, ok := ParseUPID(upid)
		if !ok || typ != "download" || id != "Cloud_Image.qcow2" {
			t.Fatalf("UPID %s: type %q id %q", upid, typ, id)
		}
		if st := e.wait(upid); st != "OK" {
			t.Fatalf("download: %s", st)
		}
		log := e.taskLog(upid)
		for _, want := range []string{"downloading " + srv.URL + "/cloud.qcow2 to ", "calculating checksum...OK, checksum verified", "finished"} {
			if !strings.Contains(log, want) {
				t.Errorf("log lacks %q:\n%s", want, log)
			}
		}
		got, err := os.ReadFile(filepath.Join(e.importDir(), "Cloud_Image.qcow2"))
		if err != nil || !bytes.Equal(got, img) {
			t.Fatalf("downloaded file: %v", err)
		}
		list, _ := e.ok("GET", "/nodes/pve/storage/local/content", url.Values{"content": {"import"}}).([]any)
		if len(list) != 1 || list[0].(map[string]any)["volid"] != "local:import/Cloud_Image.qcow2" || list[0].(map[string]any)["format"] != "qcow2" {
			t.Fatalf("content: %v", list)
		}
		if names := leftovers(t, e.importDir()); len(names) != 1 {
			t.Fatalf("import dir holds %v", names)
		}
		info, _ := e.ok("GET", "/nodes/pve/storage/local/content/local:import/Cloud_Image.qcow2", nil).(map[string]any)
		if info["format"] != "qcow2" || info["size"] != float64(2<<30) || info["path"] != filepath.Join(e.importDir(), "Cloud_Image.qcow2") {
			t.Fatalf("volume info: %v", info)
		}
	})

	t.Run("refused before the worker", func(t *testing.T) {
		for _, c := range []struct {
			name, storage string
			form          url.Values
			status        int
			reason, field string
		}{
			{"thin pool", "local-lvm", url.Values{"content": {"import"}, "filename": {"a.qcow2"}}, 500, "can't upload to storage type 'lvmthin', not a file based storage!", ""},
			{"missing storage", "nfs", url.Values{"content": {"import"}, "filename": {"a.qcow2"}}, 500, "storage 'nfs' does not exist", ""},
			{"import extension", "local", url.Values{"content": {"import"}, "filename": {"a.img"}}, 400, "", "invalid filename or wrong extension"},
			{"ovf is not uploadable", "local", url.Values{"content": {"import"}, "filename": {"a.ovf"}}, 400, "", "invalid filename or wrong extension"},
			{"iso extension", "local", url.Values{"content": {"iso"}, "filename": {"a.qcow2"}}, 400, "", "wrong file extension"},
			{"vztmpl extension", "local", url.Values{"content": {"vztmpl"}, "filename": {"a.tar.lz"}}, 400, "", "wrong file extension"},
		} {
			t.Run(c.name, func(t *testing.T) {
				c.form.Set("url", srv.URL+"/cloud.qcow2")
				r := e.do("POST", "/nodes/pve/storage/"+c.storage+"/download-url", c.form, authTicket)
				if r.status != c.status || c.reason != "" && r.reason != c.reason || c.field != "" && r.errors()["filename"] != c.field {
					t.Fatalf("%d %q %v", r.status, r.reason, r.errors())
				}
			})
		}
		e.s.SetStorageContent("local", "backup,iso,vztmpl")
		r := e.do("POST", dl, url.Values{"content": {"import"}, "filename": {"a.qcow2"}, "url": {srv.URL + "/cloud.qcow2"}}, authTicket)
		e.s.SetStorageContent("local", "backup,iso,vztmpl,import,images,snippets")
		if r.status != 500 || r.reason != "storage 'local' is not configured for content-type 'import'" {
			t.Fatalf("a fresh node's local: %d %q", r.status, r.reason)
		}
		if r := e.do("POST", dl, url.Values{"content": {"import"}, "filename": {"a.qcow2"}, "url": {"ftp://x/a.qcow2"}}, authTicket); r.status != 400 || r.errors()["url"] == "" {
			t.Fatalf("ftp url: %d %v", r.status, r.errors())
		}
	})

	t.Run("task failures leave no file", func(t *testing.T) {
		for _, c := range []struct {
			name string
			form url.Values
			want string
		}{
			{"checksum mismatch", url.Values{"content": {"import"}, "filename": {"m.qcow2"}, "url": {srv.URL + "/cloud.qcow2"}, "checksum": {strings.Repeat("0", 64)}, "checksum-algorithm": {"sha256"}},
				"checksum mismatch: got '" + sha256Hex(img) + "' != expect '" + strings.Repeat("0", 64) + "'"},
			{"not a qcow2", url.Values{"content": {"import"}, "filename": {"n.qcow2"}, "url": {srv.URL + "/notqcow.text"}}, "failed to verify file: qemu-img: Could not open '"},
			{"qcow2 with a backing file", url.Values{"content": {"import"}, "filename": {"b.qcow2"}, "url": {srv.URL + "/backing.img"}}, "failed to verify file: backing file not allowed for untrusted image"},
			{"ova without ovf", url.Values{"content": {"import"}, "filename": {"b.ova"}, "url": {srv.URL + "/bad.ova"}}, "failed to verify file: ova archive has no .ovf file inside"},
			{"compression of an import", url.Values{"content": {"import"}, "filename": {"c.qcow2"}, "url": {srv.URL + "/cloud.qcow2"}, "compression": {"gz"}}, "decompression not supported for import"},
			{"unknown compression", url.Values{"content": {"iso"}, "filename": {"c.iso"}, "url": {srv.URL + "/plain.iso"}, "compression": {"xz"}}, "no decompression method found"},
			{"missing file", url.Values{"content": {"import"}, "filename": {"gone.qcow2"}, "url": {srv.URL + "/gone.qcow2"}}, "download failed: command 'wget --progress=dot:giga -O "},
		} {
			t.Run(c.name, func(t *testing.T) {
				before := leftovers(t, e.importDir())
				st := e.task("POST", dl, c.form)
				if !strings.Contains(st, c.want) {
					t.Fatalf("exit status %q, want %q", st, c.want)
				}
				if after := leftovers(t, e.importDir()); len(after) != len(before) {
					t.Fatalf("import dir %v after, %v before", after, before)
				}
			})
		}
	})

	t.Run("raw accepts any bytes, an ova with an ovf passes", func(t *testing.T) {
		for name, path := range map[string]string{"any.raw": "/notqcow.raw", "appliance.ova": "/good.ova"} {
			if st := e.task("POST", dl, url.Values{"content": {"import"}, "filename": {name}, "url": {srv.URL + path}}); st != "OK" {
				t.Fatalf("%s: %s", name, st)
			}
		}
	})

	t.Run("an existing file", func(t *testing.T) {
		form := url.Values{"content": {"import"}, "filename": {"Cloud_Image.qcow2"}, "url": {srv.URL + "/cloud.qcow2"}}
		if st := e.task("POST", dl, form); !strings.Contains(st, "refusing to override existing file '") {
			t.Fatalf("without checksum: %s", st)
		}
		form.Set("checksum", sha256Hex(img))
		form.Set("checksum-algorithm", "sha256")
		upid := e.ok("POST", dl, form).(string)
		if st := e.wait(upid); st != "OK" || !strings.Contains(e.taskLog(upid), "OK, got correct file already, no need to download") {
			t.Fatalf("same checksum: %s\n%s", st, e.taskLog(upid))
		}
		form.Set("checksum", strings.Repeat("1", 64))
		if st := e.task("POST", dl, form); !strings.HasSuffix(st, "', aborting") {
			t.Fatalf("other checksum: %s", st)
		}
	})

	t.Run("iso decompressed", func(t *testing.T) {
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		_, _ = zw.Write([]byte("an iso image"))
		_ = zw.Close()
		srv2 := fileServer(t, map[string][]byte{"/x.iso.gz": gz.Bytes()})
		if st := e.task("POST", dl, url.Values{"content": {"iso"}, "filename": {"x.iso"}, "url": {srv2.URL + "/x.iso.gz"}, "compression": {"gz"}}); st != "OK" {
			t.Fatalf("download: %s", st)
		}
		got, _ := os.ReadFile(filepath.Join(e.s.storageDir(), "template", "iso", "x.iso"))
		if string(got) != "an iso image" {
			t.Fatalf("iso content %q", got)
		}
		list, _ := e.ok("GET", "/nodes/pve/storage/local/content", url.Values{"content": {"iso"}}).([]any)
		if len(list) != 1 || list[0].(map[string]any)["volid"] != "local:iso/x.iso" {
			t.Fatalf("iso content: %v", list)
		}
		upid := e.ok("DELETE", "/nodes/pve/storage/local/content/local:iso/x.iso", nil).(string)
		if st := e.wait(upid); st != "OK" {
			t.Fatalf("delete: %s", st)
		}
		if _, err := os.Stat(filepath.Join(e.s.storageDir(), "template", "iso", "x.iso")); !os.IsNotExist(err) {
			t.Fatalf("deleted iso: %v", err)
		}
	})
}

// TestDownloadRace: two downloads of one file name that both start before
// either ends both succeed (download_file_from_url checks for an existing
// file before it downloads, each to its own temporary file, and renames
// last); a third one, after, is refused.
func TestDownloadRace(t *testing.T) {
	img := qcow2Image(1 << 30)
	var mu sync.Mutex
	arrived := 0
	both := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		arrived++
		if arrived == 2 {
			close(both)
		}
		mu.Unlock()
		<-both
		_, _ = w.Write(img)
	}))
	defer ts.Close()
	e := newEnv(t)
	e.s.SetStorageContent("local", "backup,iso,vztmpl,import")
	form := url.Values{"content": {"import"}, "filename": {"r.qcow2"}, "url": {ts.URL + "/r.qcow2"}}
	a := e.ok("POST", "/nodes/pve/storage/local/download-url", form).(string)
	b := e.ok("POST", "/nodes/pve/storage/local/download-url", form).(string)
	if sa, sb := e.wait(a), e.wait(b); sa != "OK" || sb != "OK" {
		t.Fatalf("racing downloads: %q, %q", sa, sb)
	}
	if names := leftovers(t, e.importDir()); len(names) != 1 || names[0] != "r.qcow2" {
		t.Fatalf("import dir: %v", names)
	}
	if st := e.task("POST", "/nodes/pve/storage/local/download-url", form); !strings.Contains(st, "refusing to override existing file") {
		t.Fatalf("third: %s", st)
	}
}

// TestDownloadPermissions: the schema's check, Datastore.AllocateTemplate
// on the storage and (Sys.Audit and Sys.Modify on / or Sys.AccessNetwork
// on the node); pve-access-setup's token has none of it.
func TestDownloadPermissions(t *testing.T) {
	srv := fileServer(t, map[string][]byte{"/a.qcow2": qcow2Image(1 << 20)})
	e := newEnv(t)
	e.s.SetStorageContent("local", "backup,iso,vztmpl,import")
	id, secret, err := e.s.ApplyAccessSetup(AccessSetup{Templates: []int{templateID}})
	if err != nil {
		t.Fatal(err)
	}
	form := url.Values{"content": {"import"}, "filename": {"a.qcow2"}, "url": {srv.URL + "/a.qcow2"}}
	dl := "/nodes/pve/storage/local/download-url"
	if r := e.do("POST", dl, form, authNone, "Authorization", "PVEAPIToken="+id+"="+secret); r.status != 403 {
		t.Fatalf("pve-access-setup's token: %d %q", r.status, r.reason)
	}
	if err := e.s.AddUser("dl@pve", ""); err != nil {
		t.Fatal(err)
	}
	if err := e.s.AddRole("Tmpl", []string{"Datastore.AllocateTemplate"}); err != nil {
		t.Fatal(err)
	}
	if err := e.s.AddRole("Net", []string{"Sys.AccessNetwork"}); err != nil {
		t.Fatal(err)
	}
	if err := e.s.AddRole("SysMod", []string{"Sys.Modify"}); err != nil {
		t.Fatal(err)
	}
	tok, sec, err := e.s.AddToken("dl@pve", "dltok", false)
	if err != nil {
		t.Fatal(err)
	}
	auth := []string{"Authorization", "PVEAPIToken=" + tok + "=" + sec}
	if err := e.s.SetACL("/storage/local", "dl@pve", "Tmpl", false); err != nil {
		t.Fatal(err)
	}
	if r := e.do("POST", dl, form, authNone, auth...); r.status != 403 {
		t.Fatalf("storage privilege only: %d %q", r.status, r.reason)
	}
	if err := e.s.SetACL("/", "dl@pve", "SysMod", false); err != nil {
		t.Fatal(err)
	}
	if r := e.do("POST", dl, form, authNone, auth...); r.status != 403 {
		t.Fatalf("Sys.Modify without Sys.Audit on /: %d %q", r.status, r.reason)
	}
	if err := e.s.SetACL("/nodes/pve", "dl@pve", "Net", false); err != nil {
		t.Fatal(err)
	}
	r := e.do("POST", dl, form, authNone, auth...)
	if r.status != 200 {
		t.Fatalf("with Sys.AccessNetwork on the node: %d %q", r.status, r.reason)
	}
	if st := e.wait(r.body["data"].(string)); st != "OK" {
		t.Fatalf("download: %s", st)
	}
}
