package pveapi_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// newUploadEmu is an emulated node whose root@pam password is pw.
func newUploadEmu(t *testing.T) *pveemu.Server {
	t.Helper()
	dir := t.TempDir()
	fb := pveemu.NewFakeBackend(filepath.Join(dir, "run"))
	s, err := pveemu.New(pveemu.Options{Node: "pve", Backend: fb, DataDir: filepath.Join(dir, "data"), StatsInterval: -1, RootPassword: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(); _ = fb.Close() })
	return s
}

// emuClient is root@pam's client of the emulated node h serves (s, or a
// handler in front of it).
func emuClient(t *testing.T, h http.Handler) *pveapi.Client {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	c, err := pveapi.NewWithPassword(pveapi.Options{URL: ts.URL + "/api2/json", Node: "pve", HTTPClient: ts.Client(), TaskPoll: time.Millisecond}, "root@pam", "pw")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestUploadFile: UploadFile streams a file to a storage's import
// directory, Proxmox verifying its sha256 (pve-storage Status.pm upload);
// a wrong digest fails the task and keeps nothing; a storage without the
// content, a filename Proxmox would rename, a body shorter than its size
// are refused with what to do.
func TestUploadFile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newUploadEmu(t)
	c := emuClient(t, s)
	data := []byte(strings.Repeat("raw image ", 4096))
	h := sha256.Sum256(data)
	sum := hex.EncodeToString(h[:])
	up := pveapi.Upload{Content: "import", Filename: "disk.raw", Size: int64(len(data)), Checksum: sum, ChecksumAlgorithm: "sha256"}

	// A fresh node's local takes no import content.
	if _, err := c.UploadFile(ctx, "local", up, strings.NewReader(string(data))); err == nil || !strings.Contains(err.Error(), "pvesm set local --content") {
		t.Errorf("upload to a storage without import: %v", err)
	}
	s.SetStorageContent("local", "backup,iso,vztmpl,import")
	vol, err := c.UploadFile(ctx, "local", up, strings.NewReader(string(data)))
	if err != nil || vol != "local:import/disk.raw" {
		t.Fatalf("upload: %q %v", vol, err)
	}
	p, err := c.VolumePath(ctx, vol)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(p); err != nil || string(got) != string(data) {
		t.Errorf("stored file: %d bytes %v, want the upload", len(got), err)
	}

	wrong := up
	wrong.Filename = "wrong.raw"
	wrong.Checksum = strings.Repeat("0", 64)
	if _, err := c.UploadFile(ctx, "local", wrong, strings.NewReader(string(data))); err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Errorf("wrong digest: %v, want Proxmox's checksum mismatch", err)
	}
	short := up
	short.Filename = "short.raw"
	short.Size++
	if _, err := c.UploadFile(ctx, "local", short, strings.NewReader(string(data))); !errors.Is(err, pveapi.ErrShortUpload) {
		t.Errorf("short body: %v, want ErrShortUpload", err)
	}
	vols, err := c.StorageVolumes(ctx, "local", "import")
	if err != nil || len(vols) != 1 || vols[0].VolID != "local:import/disk.raw" {
		t.Errorf("import volumes %+v %v, want only disk.raw", vols, err)
	}
	for _, bad := range []pveapi.Upload{
		{Content: "import", Filename: "a b.raw", Size: 1},
		{Content: "import", Filename: "../x.raw", Size: 1},
		{Content: "images", Filename: "x.raw", Size: 1},
		{Content: "import", Filename: "x.raw", Size: 0},
		{Content: "import", Filename: "x.raw", Size: 1, Checksum: sum},
	} {
		if _, err := c.UploadFile(ctx, "local", bad, strings.NewReader("x")); err == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
}

// TestUploadFileCancelled: ctx bounds the whole upload: a node that took
// the body and never answers is left when ctx ends (go-proxmox's
// UploadReader sent with context.Background(), and the client has no
// timeout: the call waited forever).
func TestUploadFileCancelled(t *testing.T) {
	s := newUploadEmu(t)
	s.SetStorageContent("local", "backup,iso,vztmpl,import")
	sent, release := make(chan int64, 1), make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/upload") {
			s.ServeHTTP(w, r)
			return
		}
		n, _ := io.Copy(io.Discard, r.Body)
		sent <- n
		select { // no answer
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(ts.Close)
	t.Cleanup(func() { close(release) })
	c, err := pveapi.NewWithPassword(pveapi.Options{URL: ts.URL + "/api2/json", Node: "pve", HTTPClient: ts.Client(), TaskPoll: time.Millisecond}, "root@pam", "pw")
	if err != nil {
		t.Fatal(err)
	}
	data := strings.Repeat("raw image ", 4096)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.UploadFile(ctx, "local", pveapi.Upload{Content: "import", Filename: "disk.raw", Size: int64(len(data))}, strings.NewReader(data))
		done <- err
	}()
	select {
	case n := <-sent:
		if n <= int64(len(data)) {
			t.Errorf("the node got %d bytes, want the file (%d) and its form", n, len(data))
		}
	case err := <-done:
		t.Fatalf("upload ended before the node took the body: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled upload: %v, want context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a cancelled upload still waits for the node's answer")
	}
}

// TestStorageStatus: StorageStatus reads a storage's state and sizes on
// the node (pve-storage Status.pm read_status) as the emulator reports
// them; an unknown storage is an error naming it.
func TestStorageStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newUploadEmu(t)
	c := emuClient(t, s)
	s.SetStorageSpace("local", pveemu.StorageSpace{Total: 50 << 30, Avail: 7 << 30})
	st, err := c.StorageStatus(ctx, "local")
	if err != nil || st != (pveapi.StorageStatus{Active: true, Total: 50 << 30, Used: 43 << 30, Avail: 7 << 30}) {
		t.Errorf("status of local: %+v %v", st, err)
	}
	if _, err := c.StorageStatus(ctx, "nfs1"); err == nil || !strings.Contains(err.Error(), "storage nfs1") {
		t.Errorf("status of an unknown storage: %v", err)
	}
}
