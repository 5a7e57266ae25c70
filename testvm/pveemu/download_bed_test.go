package pveemu

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestDownloadOnBed: download-url on the bed fetches from the uplink's
// internet host through the node's network (BedBackend's NodeDialer):
// the image the test puts in ImagesDir becomes an import volume, which a
// VM create imports; a missing file fails the task as wget's error
// response does.
func TestDownloadOnBed(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	images := t.TempDir()
	img := qcow2Image(1 << 30)
	if err := os.WriteFile(filepath.Join(images, "cloud.qcow2"), img, 0o644); err != nil {
		t.Fatal(err)
	}
	_, e := bedEnvWith(ctx, t, testvm.Options{ImagesDir: images})
	e.s.SetStorageContent("local", "backup,iso,vztmpl,import,images")
	dl := "/nodes/pve/storage/local/download-url"
	if st := e.task("POST", dl, url.Values{"content": {"import"}, "filename": {"cloud.qcow2"}, "url": {testvm.ImagesURL("cloud.qcow2")},
		"checksum": {sha256Hex(img)}, "checksum-algorithm": {"sha256"}}); st != "OK" {
		t.Fatalf("download from the internet host: %s", st)
	}
	if st := e.task("POST", dl, url.Values{"content": {"import"}, "filename": {"gone.qcow2"}, "url": {testvm.ImagesURL("gone.qcow2")}}); !strings.Contains(st, "exit code 8") {
		t.Fatalf("missing file: %s", st)
	}
	if st := e.task("POST", "/nodes/pve/qemu", url.Values{"vmid": {"100"}, "scsi0": {"local:0,import-from=local:import/cloud.qcow2"}}); st != "OK" {
		t.Fatalf("create: %s", st)
	}
	if conf := e.config("100"); conf["scsi0"] != "local:100/vm-100-disk-0.qcow2,size=1G" {
		t.Fatalf("scsi0: %v", conf["scsi0"])
	}
}
