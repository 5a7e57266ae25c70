package main

import (
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/provision"
)

// TestNestedCreateCommand wires `nested create` and `nested list` with a
// recording runner (no QEMU is started) and a local image server.
func TestNestedCreateCommand(t *testing.T) {
	img := []byte("QFI\xfb stand-in image")
	sum := sha512.Sum512(img)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/SHA512SUMS":
			fmt.Fprintf(w, "%s  debian-13-genericcloud-amd64.qcow2\n", hex.EncodeToString(sum[:]))
		case "/debian-13-genericcloud-amd64.qcow2":
			w.Write(img)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	rec := &provision.RecordingRunner{Replies: []*provision.Reply{{Prefix: "qemu-img"}, {Prefix: "qemu-system-x86_64"}}}
	d := fixtureDeps(rec)
	d.http = srv.Client()
	root := fixtureRoot(t)
	dir := t.TempDir()
	out, err := runCmd(t, d, "nested", "create", "lab1", "--dir", dir, "--accel", "tcg", "--cache-dir", t.TempDir(),
		"--image-url", srv.URL+"/debian-13-genericcloud-amd64.qcow2", "--sums-url", srv.URL+"/SHA512SUMS",
		"--node-config", filepath.Join(root, "etc/pve-bootstrap/config.toml"),
		"--binary-url", "https://files.example.test/pve-bootstrap", "--binary-sha256", strings.Repeat("ef", 32),
		"--api-port", "28006", "--sandbox-port", "28443")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "https://127.0.0.1:28006/") {
		t.Errorf("output:\n%s", out)
	}
	ud, err := os.ReadFile(filepath.Join(dir, "lab1", "user-data"))
	if err != nil {
		t.Fatal(err)
	}
	// The node is named after the VM whatever the config said.
	if !strings.Contains(string(ud), `hostname = "lab1"`) {
		t.Errorf("user-data does not name the node lab1:\n%s", ud)
	}
	lines := rec.Lines()
	if len(lines) != 2 || !strings.Contains(lines[1], "hostfwd=tcp:127.0.0.1:28006-:8006,hostfwd=tcp:127.0.0.1:28443-:8443") || !strings.Contains(lines[1], "-accel tcg") {
		t.Errorf("commands:\n%s", strings.Join(lines, "\n"))
	}
	out, err = runCmd(t, d, "nested", "list", "--dir", dir)
	if err != nil || !strings.Contains(out, "lab1") || !strings.Contains(out, "stopped") {
		t.Errorf("list: %v\n%s", err, out)
	}
	_, err = runCmd(t, d, "nested", "create", "Bad_Name", "--dir", dir, "--accel", "tcg",
		"--node-config", filepath.Join(root, "etc/pve-bootstrap/config.toml"),
		"--binary-url", "https://files.example.test/pve-bootstrap", "--binary-sha256", strings.Repeat("ef", 32))
	if err == nil || !strings.Contains(err.Error(), "node name") {
		t.Errorf("bad name: %v", err)
	}
}
