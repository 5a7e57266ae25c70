package pveemu

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// startAgentVM clones and starts VM 101 with the agent and returns the
// directory its agent sees as /.
func startAgentVM(t *testing.T, e *env) string {
	t.Helper()
	e.setupZone()
	e.clone("101")
	if st := e.task("POST", "/nodes/pve/qemu/101/status/start", nil); st != "OK" {
		t.Fatalf("start: %s", st)
	}
	root := e.fb.GuestRoot(101)
	if root == "" {
		t.Fatal("guest 101 has no root")
	}
	return root
}

// fromLatin1 is the inverse of PVE's byte string encoding: each character
// must be U+0000..U+00FF and is one byte.
func fromLatin1(t *testing.T, s string) []byte {
	t.Helper()
	out := make([]byte, 0, len(s))
	for i, r := range s {
		if r > 0xff {
			t.Fatalf("character %U at %d is not one byte", r, i)
		}
		out = append(out, byte(r))
	}
	return out
}

// everyByte is n bytes cycling through all 256 values (invalid UTF-8).
func everyByte(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

func TestVersionByRelease(t *testing.T) {
	for _, tc := range []struct {
		release       Release
		version, name string
	}{
		{"", "9.1.3", "9.1"},
		{Release91, "9.1.3", "9.1"},
		{Release92, "9.2.2", "9.2"},
	} {
		t.Run(string(tc.release), func(t *testing.T) {
			e := newEnvWith(t, Options{Release: tc.release})
			v := e.ok("GET", "/version", nil).(map[string]any)
			if v["version"] != tc.version || v["release"] != tc.name {
				t.Fatalf("GET /version: %v", v)
			}
		})
	}
	if _, err := New(Options{Node: "pve", Backend: NewFakeBackend(t.TempDir()), DataDir: t.TempDir(), Release: "9.3"}); err == nil {
		t.Fatal("release 9.3 accepted")
	}
}

// TestAgentFileReadByRelease: file-read returns the file's bytes as one
// Latin-1 character each (decode=1, both releases); 9.1 refuses count,
// offset and decode; 9.2 takes them, and decode=0 gives each 1 MiB chunk's
// own base64, padding inside.
func TestAgentFileReadByRelease(t *testing.T) {
	data := everyByte(3<<20 + 1)
	for _, rel := range []Release{Release91, Release92} {
		t.Run(string(rel), func(t *testing.T) {
			e := newEnvWith(t, Options{Release: rel})
			root := startAgentVM(t, e)
			if err := os.WriteFile(filepath.Join(root, "bin.dat"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			const path = "/nodes/pve/qemu/101/agent/file-read"
			got := e.ok("GET", path, url.Values{"file": {"/bin.dat"}}).(map[string]any)
			if b := fromLatin1(t, got["content"].(string)); !bytes.Equal(b, data) {
				t.Fatalf("decoded content: %d bytes, differs from the file's %d", len(b), len(data))
			}
			if got["bytes-read"] != float64(len(data)) || got["truncated"] != nil {
				t.Fatalf("bytes-read %v truncated %v", got["bytes-read"], got["truncated"])
			}
			partial := url.Values{"file": {"/bin.dat"}, "count": {"10"}, "offset": {"5"}, "decode": {"0"}}
			if rel == Release91 {
				r := e.do("GET", path, partial, authTicket)
				errs := r.errors()
				if r.status != 400 || len(errs) != 3 || !strings.Contains(errs["count"], "not defined in schema") {
					t.Fatalf("9.1 with count/offset/decode: %d %v", r.status, r.body)
				}
				return
			}
			got = e.ok("GET", path, partial).(map[string]any)
			if got["content"] != base64.StdEncoding.EncodeToString(data[5:15]) || got["truncated"] != float64(1) {
				t.Fatalf("count/offset/decode=0: %v", got)
			}
			content := e.ok("GET", path, url.Values{"file": {"/bin.dat"}, "decode": {"0"}}).(map[string]any)["content"].(string)
			if _, err := base64.StdEncoding.DecodeString(content); err == nil {
				t.Fatal("decode=0 content is one base64 stream; want one per 1 MiB chunk")
			}
			var joined []byte
			for _, seg := range regexp.MustCompile(`[A-Za-z0-9+/]+={0,2}`).FindAllString(content, -1) {
				b, err := base64.StdEncoding.DecodeString(seg)
				if err != nil {
					t.Fatal(err)
				}
				joined = append(joined, b...)
			}
			if !bytes.Equal(joined, data) {
				t.Fatalf("decode=0 segments: %d bytes, differ from the file", len(joined))
			}
		})
	}
}

// TestAgentExecStatusBytes: exec-status out-data is the command's output
// as one Latin-1 character per byte, in both releases.
func TestAgentExecStatusBytes(t *testing.T) {
	out := append(everyByte(512), "\xf0\x9f\x98\x80"...)
	for _, rel := range []Release{Release91, Release92} {
		t.Run(string(rel), func(t *testing.T) {
			e := newEnvWith(t, Options{Release: rel})
			root := startAgentVM(t, e)
			if err := os.WriteFile(filepath.Join(root, "out.bin"), out, 0o644); err != nil {
				t.Fatal(err)
			}
			pid := e.ok("POST", "/nodes/pve/qemu/101/agent/exec", url.Values{"command": {"cat", "/out.bin"}}).(map[string]any)["pid"]
			st := e.ok("GET", "/nodes/pve/qemu/101/agent/exec-status", url.Values{"pid": {fmt.Sprint(pid)}}).(map[string]any)
			if b := fromLatin1(t, st["out-data"].(string)); !bytes.Equal(b, out) {
				t.Fatalf("out-data: %q", st["out-data"])
			}
			if st["exited"] != float64(1) {
				t.Fatalf("exited: %v", st["exited"])
			}
		})
	}
}

// rawGet is a GET with its own Accept-Encoding (so Go's transport does not
// decompress) and the body as received.
func (e *env) rawGet(path string, q url.Values, acceptEncoding string) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest("GET", e.ts.URL+"/api2/json"+path+"?"+q.Encode(), nil)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Cookie", "PVEAuthCookie="+url.QueryEscape(e.ticket))
	req.Header.Set("Accept-Encoding", acceptEncoding)
	res, err := e.ts.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return res, body
}

// TestResponseCompression: with gzip or deflate accepted an answer over
// 1 KiB comes compressed; a protected call's large incompressible answer
// (a 14 MiB random file read) fails 597 as pveproxy's does, and comes
// whole as identity.
func TestResponseCompression(t *testing.T) {
	e := newEnv(t)
	root := startAgentVM(t, e)
	random := make([]byte, 14680064)
	_, _ = rand.Read(random)
	if err := os.WriteFile(filepath.Join(root, "random"), random, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "zeros"), make([]byte, 14680064), 0o644); err != nil {
		t.Fatal(err)
	}
	const path = "/nodes/pve/qemu/101/agent/file-read"
	for _, tc := range []struct {
		file, accept string
		status       int
		encoding     string
	}{
		{"/random", "identity", 200, ""},
		{"/random", "gzip", 597, ""},
		{"/random", "gzip, deflate, br", 597, ""},
		{"/random", "deflate", 597, ""},
		{"/zeros", "gzip, deflate", 200, "gzip"},
		{"/zeros", "identity", 200, ""},
	} {
		t.Run(tc.file+" "+tc.accept, func(t *testing.T) {
			res, body := e.rawGet(path, url.Values{"file": {tc.file}}, tc.accept)
			if res.StatusCode != tc.status || res.Header.Get("Content-Encoding") != tc.encoding {
				t.Fatalf("status %q, Content-Encoding %q", res.Status, res.Header.Get("Content-Encoding"))
			}
			if tc.status == 597 {
				if res.Status != "597 Broken pipe" || len(body) != 0 {
					t.Fatalf("status %q, %d bytes of body", res.Status, len(body))
				}
				return
			}
			if tc.encoding == "gzip" {
				zr, err := gzip.NewReader(bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				if body, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
			}
			var got struct {
				Data struct {
					Content string `json:"content"`
				} `json:"data"`
			}
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatal(err)
			}
			if want := map[string][]byte{"/random": random, "/zeros": make([]byte, 14680064)}[tc.file]; !bytes.Equal(fromLatin1(t, got.Data.Content), want) {
				t.Fatal("content differs from the file")
			}
		})
	}
	res, _ := e.rawGet("/version", nil, "gzip")
	if res.StatusCode != 200 || res.Header.Get("Content-Encoding") != "" {
		t.Fatalf("small answer: %s, Content-Encoding %q", res.Status, res.Header.Get("Content-Encoding"))
	}
}

// multipartUpload builds the form the reference plugin's curl upload sends:
// content, then the file as "filename".
func multipartUpload(t *testing.T, content, field, name string, data []byte) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if err := mw.WriteField("content", content); err != nil {
		t.Fatal(err)
	}
	fw, err := mw.CreateFormFile(field, name)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = fw.Write(data)
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return mw.FormDataContentType(), &buf
}

func (e *env) post(path, contentType string, body io.Reader) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest("POST", e.ts.URL+"/api2/json"+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Cookie", "PVEAuthCookie="+url.QueryEscape(e.ticket))
	req.Header.Set("CSRFPreventionToken", e.csrf)
	res, err := e.ts.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, b
}

// TestUploadAndISOVolumes: a 6 MiB ISO upload (multipart, streamed) lands
// in the dir storage's template/iso in an imgcopy task, is listed as
// local:iso/NAME, and DELETE .../content/local:iso/NAME frees it; a wrong
// extension is a parameter error; a body over 512 KiB that is not an
// upload is 501 "for data too large" with the message as its body.
func TestUploadAndISOVolumes(t *testing.T) {
	e := newEnv(t)
	iso := everyByte(6 << 20)
	ct, body := multipartUpload(t, "iso", "filename", "write me.iso", iso)
	res, raw := e.post("/nodes/pve/storage/local/upload", ct, body)
	var ans struct {
		Data string `json:"data"`
	}
	if res.StatusCode != 200 || json.Unmarshal(raw, &ans) != nil {
		t.Fatalf("upload: %s %q", res.Status, raw)
	}
	if st := e.wait(ans.Data); st != "OK" {
		t.Fatalf("imgcopy task: %s", st)
	}
	stored := filepath.Join(e.s.storageDir(), "template", "iso", "write_me.iso")
	if b, err := os.ReadFile(stored); err != nil || !bytes.Equal(b, iso) {
		t.Fatalf("stored ISO: %v (%d bytes)", err, len(b))
	}
	for _, rec := range e.s.Requests() {
		if tmp, ok := rec.Params["tmpfilename"].(string); ok {
			if _, err := os.Stat(tmp); !os.IsNotExist(err) {
				t.Fatalf("temporary file %s left: %v", tmp, err)
			}
		}
	}
	list := e.ok("GET", "/nodes/pve/storage/local/content", url.Values{"content": {"iso"}}).([]any)
	if len(list) != 1 || list[0].(map[string]any)["volid"] != "local:iso/write_me.iso" || list[0].(map[string]any)["size"] != float64(len(iso)) {
		t.Fatalf("iso content: %v", list)
	}
	all := fmt.Sprint(e.ok("GET", "/nodes/pve/storage/local/content", nil))
	if !strings.Contains(all, "volid:local:iso/write_me.iso") {
		t.Fatalf("content without a filter: %s", all)
	}
	if st := e.task("DELETE", "/nodes/pve/storage/local/content/local:iso/write_me.iso", nil); st != "OK" {
		t.Fatalf("delete: %s", st)
	}
	if _, err := os.Stat(stored); !os.IsNotExist(err) {
		t.Fatalf("ISO still there: %v", err)
	}
	r := e.do("DELETE", "/nodes/pve/storage/local/content/local:iso/x.txt", nil, authTicket)
	if r.status != 500 || r.reason != "unable to parse directory volume name 'iso/x.txt'" {
		t.Fatalf("bad volume name: %d %q", r.status, r.reason)
	}

	ct, body = multipartUpload(t, "iso", "filename", "image.txt", []byte("x"))
	res, raw = e.post("/nodes/pve/storage/local/upload", ct, body)
	if res.StatusCode != 400 || !strings.Contains(string(raw), `"filename":"wrong file extension"`) {
		t.Fatalf("wrong extension: %s %q", res.Status, raw)
	}
	ct, body = multipartUpload(t, "iso", "file", "a.iso", []byte("x"))
	res, _ = e.post("/nodes/pve/storage/local/upload", ct, body)
	if res.StatusCode != 500 || res.Status != "500 wrong field name 'file' for file upload, expected 'filename'" {
		t.Fatalf("wrong field: %s", res.Status)
	}

	// pve-http-server answers a body over the limit at once and closes
	// without reading it (as the emulator does), so a client still
	// writing may see the connection reset instead of the answer; either
	// way the request is refused, never taken.
	req, err := http.NewRequest("POST", e.ts.URL+"/api2/json/nodes/pve/qemu/9000/config",
		strings.NewReader("description="+strings.Repeat("a", maxPost)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Cookie", "PVEAuthCookie="+url.QueryEscape(e.ticket))
	req.Header.Set("CSRFPreventionToken", e.csrf)
	res, err = e.ts.Client().Do(req)
	switch {
	case err != nil && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)):
		t.Logf("large body: the connection was closed while the body was written: %v", err)
	case err != nil:
		t.Fatalf("large body: %v", err)
	default:
		raw, _ = io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 501 || res.Status != "501 for data too large" || string(raw) != "for data too large" {
			t.Fatalf("large body: %s %q", res.Status, raw)
		}
	}
	if desc := e.ok("GET", "/nodes/pve/qemu/9000/config", nil).(map[string]any)["description"]; strings.HasPrefix(fmt.Sprint(desc), "aaaa") {
		t.Fatal("large body: the description was set")
	}
}

// TestConfigValueTypes: GET config returns memory as the string the schema
// has, integer and boolean keys as numbers.
func TestConfigValueTypes(t *testing.T) {
	e := newEnv(t)
	e.setupZone()
	e.clone("101")
	e.ok("PUT", "/nodes/pve/qemu/101/config", url.Values{"memory": {"768"}, "cores": {"2"}, "onboot": {"1"}})
	conf := e.ok("GET", "/nodes/pve/qemu/101/config", nil).(map[string]any)
	if conf["memory"] != "768" || conf["cores"] != float64(2) || conf["onboot"] != float64(1) {
		t.Fatalf("memory %#v cores %#v onboot %#v", conf["memory"], conf["cores"], conf["onboot"])
	}
}

// TestCDROMMediaChange: an uploaded ISO set as the medium of a running
// VM's existing CD-ROM drive (the reference plugin's fast write path:
// sata5) reaches the guest as sr0, also without disk hotplug; "none"
// ejects it.
func TestCDROMMediaChange(t *testing.T) {
	for _, hotplug := range []string{"", "0"} {
		t.Run("hotplug="+hotplug, func(t *testing.T) {
			conf := url.Values{"sata5": {"none,media=cdrom"}}
			if hotplug != "" {
				conf.Set("hotplug", hotplug)
			}
			e, bf, _ := runningClone(t, conf)
			ct, body := multipartUpload(t, "iso", "filename", "payload.iso", []byte("iso"))
			res, raw := e.post("/nodes/pve/storage/local/upload", ct, body)
			var ans struct {
				Data string `json:"data"`
			}
			if res.StatusCode != 200 || json.Unmarshal(raw, &ans) != nil || e.wait(ans.Data) != "OK" {
				t.Fatalf("upload: %s %q", res.Status, raw)
			}
			if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"sata5": {"local:iso/payload.iso,media=cdrom"}}); st != "OK" {
				t.Fatalf("insert: %s", st)
			}
			bf.mu.Lock()
			got := bf.byID["sr0"]
			bf.mu.Unlock()
			if got != "ata-QEMU_DVD-ROM_QM00000" {
				t.Fatalf("sr0 by-id %q; plugged %v", got, bf.byID)
			}
			if c := e.ok("GET", "/nodes/pve/qemu/101/config", nil).(map[string]any); c["sata5"] != "local:iso/payload.iso,media=cdrom" {
				t.Fatalf("sata5 = %v", c["sata5"])
			}
			if st := e.task("POST", "/nodes/pve/qemu/101/config", url.Values{"sata5": {"none,media=cdrom"}}); st != "OK" {
				t.Fatalf("eject: %s", st)
			}
			bf.mu.Lock()
			_, still := bf.byID["sr0"]
			bf.mu.Unlock()
			if still {
				t.Fatal("medium still in after eject")
			}
		})
	}
}
