package kvm

import (
	"context"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/provision"
)

// TestLifecycleRealQEMU runs create, list, stop, clone, start and delete
// with the real qemu-img and QEMU (TCG; the guest never boots anything, no
// kernel is needed) on a stand-in base image served with its SHA512SUMS.
func TestLifecycleRealQEMU(t *testing.T) {
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not installed (CI)", bin)
			}
			t.Skipf("SKIPPING: %s not installed", bin)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	work := t.TempDir()
	base := filepath.Join(work, "debian-13-genericcloud-amd64.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-f", "qcow2", base, "64M").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	img, _ := os.ReadFile(base)
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

	m := &Manager{Dir: filepath.Join(work, "nodes"), Runner: provision.ExecRunner{}, HTTP: srv.Client()}
	t.Cleanup(func() {
		nodes, _ := m.List()
		for _, n := range nodes {
			m.Delete(context.Background(), n.Name)
		}
	})
	api := freePort(t)
	n, err := m.Create(ctx, CreateOptions{
		Name: "life1", Image: Image{URL: srv.URL + "/debian-13-genericcloud-amd64.qcow2", SumsURL: srv.URL + "/SHA512SUMS"},
		CacheDir: filepath.Join(work, "cache"), UserData: []byte("#cloud-config\n"), CPUs: 1, MemoryMiB: 256, DiskGiB: 8, Accel: "tcg",
		Forwards: []Forward{{Name: "proxmox-api", HostAddr: "127.0.0.1", HostPort: api, GuestPort: 8006}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !n.Running || n.PID <= 0 {
		t.Fatalf("created node not running: %+v", n)
	}
	if info, err := exec.Command("qemu-img", "info", "-U", "--output=json", filepath.Join(n.Dir, diskFile)).CombinedOutput(); err != nil || !contains(info, `"backing-filename"`) || !contains(info, `"virtual-size": 8589934592`) {
		t.Errorf("overlay: %v\n%s", err, info)
	}
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", api), 5*time.Second)
	if err != nil {
		t.Errorf("api forward not bound: %v", err)
	} else {
		c.Close()
	}
	if err := m.Stop(ctx, "life1", time.Second); err != nil {
		t.Fatal(err)
	}
	if nodes, _ := m.List(); len(nodes) != 1 || nodes[0].Running {
		t.Fatalf("after stop: %+v", nodes)
	}
	cl, err := m.Clone(ctx, "life1", "life2", []Forward{{Name: "proxmox-api", HostAddr: "127.0.0.1", HostPort: freePort(t), GuestPort: 8006}})
	if err != nil {
		t.Fatal(err)
	}
	if !cl.Running || cl.InstanceID == n.InstanceID {
		t.Errorf("clone %+v", cl)
	}
	if info, _ := exec.Command("qemu-img", "info", "-U", "--output=json", filepath.Join(cl.Dir, diskFile)).CombinedOutput(); contains(info, `"backing-filename"`) {
		t.Errorf("clone disk still depends on a backing file:\n%s", info)
	}
	if err := m.Start(ctx, "life1"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"life1", "life2"} {
		node, _ := m.read(name)
		if !node.Running {
			t.Errorf("%s not running before delete", name)
		}
		// No guest answers the ACPI power-down here: keep the grace short.
		if err := m.Stop(ctx, name, 500*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if err := m.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(node.Dir); !os.IsNotExist(err) {
			t.Errorf("%s directory left: %v", name, err)
		}
		if err := exec.Command("kill", "-0", fmt.Sprint(node.PID)).Run(); err == nil && node.PID > 0 {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", node.PID)); contains(b, node.Dir) {
				t.Errorf("%s QEMU (pid %d) still running", name, node.PID)
			}
		}
	}
}

func contains(b []byte, s string) bool { return strings.Contains(string(b), s) }
