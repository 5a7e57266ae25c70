package main

import (
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/cloud/kvm/libvirtdtest"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/provision"
)

// TestNestedBadInput: each mistake is a clear error before libvirt is
// asked to change anything (the libvirt side runs in cloud/kvm's tests
// against a libvirtd of their own).
func TestNestedBadInput(t *testing.T) {
	root := fixtureRoot(t)
	nosock := "qemu:///system?socket=" + filepath.Join(t.TempDir(), "no-such-sock")
	cfg := []string{"--node-config", filepath.Join(root, "etc/pve-bootstrap/config.toml"),
		"--binary-url", "https://files.example.test/pve-bootstrap", "--binary-sha256", strings.Repeat("ef", 32)}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad name", append([]string{"nested", "create", "Bad_Name", "--connect", nosock}, cfg...), "node name"},
		{"unreachable create", append([]string{"nested", "create", "lab1", "--connect", nosock}, cfg...), "is libvirtd running"},
		{"unreachable list", []string{"nested", "list", "--connect", nosock}, "is libvirtd running"},
		{"bad uri", []string{"nested", "list", "--connect", "vbox:///session"}, "qemu driver"},
		{"bad subnet", []string{"nested", "list", "--subnet", "10.0.0.0/33"}, "--subnet"},
		{"stop without name", []string{"nested", "stop"}, "accepts 1 arg"},
	} {
		out, err := runCmd(t, fixtureDeps(&provision.RecordingRunner{}), tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q\n%s", tc.name, err, tc.want, out)
		}
	}
}

// TestNestedVerbs runs every `nested` verb against a libvirtd the test
// starts (own namespaces, see libvirtdtest) with a blank stand-in image
// served with its SHA512SUMS; the domains never boot an OS (TCG, no KVM).
func TestNestedVerbs(t *testing.T) {
	testkit.RequireRoot(t, libvirtdtest.Tools()...)
	d := libvirtdtest.Start(t)
	work := t.TempDir()
	base := filepath.Join(work, "debian-13-genericcloud-amd64.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-f", "qcow2", base, "64M").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	img, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
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
	root := fixtureRoot(t)
	dep := fixtureDeps(&provision.RecordingRunner{})
	dep.http = srv.Client()
	conn := []string{"--connect", d.URI, "--subnet", "10.251.20.0/24", "--pool-dir", filepath.Join(d.Dir, "pool"), "--serial-log-dir", filepath.Join(d.Dir, "serial")}
	run := func(args ...string) string {
		t.Helper()
		out, err := runCmd(t, dep, append(append([]string{"nested"}, args...), conn...)...)
		if err != nil {
			t.Fatalf("nested %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	out := run("create", "lab1", "--accel", "tcg", "--cpus", "1", "--memory", "256", "--disk", "8",
		"--cache-dir", filepath.Join(work, "cache"),
		"--image-url", srv.URL+"/debian-13-genericcloud-amd64.qcow2", "--sums-url", srv.URL+"/SHA512SUMS",
		"--node-config", filepath.Join(root, "etc/pve-bootstrap/config.toml"),
		"--binary-url", "https://files.example.test/pve-bootstrap", "--binary-sha256", strings.Repeat("ef", 32))
	if !strings.Contains(out, "node lab1: running") || !strings.Contains(out, "proxmox     https://10.251.20.2:8006/") || !strings.Contains(out, "virsh console lab1") {
		t.Errorf("create printed:\n%s", out)
	}
	if got := d.Virsh(t, "list", "--name"); !strings.Contains(got, "lab1") {
		t.Errorf("virsh list:\n%s", got)
	}
	out = run("list")
	if !regexp.MustCompile(`(?m)^lab1\s+running\s+10\.251\.20\.2\s+https://10\.251\.20\.2:8006/\s+true\s+lab1-[0-9a-f]{12}$`).MatchString(out) {
		t.Errorf("list:\n%s", out)
	}
	run("stop", "lab1", "--grace", "1s")
	out = run("clone", "lab1", "lab2")
	if !strings.Contains(out, "node lab2: running") || !strings.Contains(out, "https://10.251.20.3:8006/") {
		t.Errorf("clone printed:\n%s", out)
	}
	run("start", "lab1")
	out = run("list")
	if !regexp.MustCompile(`(?m)^lab1\s+running`).MatchString(out) || !regexp.MustCompile(`(?m)^lab2\s+running\s+10\.251\.20\.3`).MatchString(out) {
		t.Errorf("list after clone and start:\n%s", out)
	}
	// After a host reboot libvirt brings the network and both nodes back.
	d.Reboot(t)
	out = run("list")
	if !regexp.MustCompile(`(?m)^lab1\s+running\s+10\.251\.20\.2\s`).MatchString(out) || !regexp.MustCompile(`(?m)^lab2\s+running\s+10\.251\.20\.3\s`).MatchString(out) {
		t.Errorf("list after a reboot:\n%s", out)
	}
	if _, err := runCmd(t, dep, append([]string{"nested", "delete", "nosuch"}, conn...)...); err == nil || !strings.Contains(err.Error(), "no such domain") {
		t.Errorf("delete of a missing node: %v", err)
	}
	run("delete", "lab1")
	run("delete", "lab2")
	if out := run("list"); strings.Contains(out, "lab") {
		t.Errorf("list after delete:\n%s", out)
	}
	inv := d.Inventory(t)
	if strings.Contains(inv, "lab") || strings.Contains(inv, "domain ") {
		t.Errorf("after delete the daemon holds:\n%s", inv)
	}
}
