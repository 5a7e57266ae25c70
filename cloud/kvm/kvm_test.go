package kvm

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/provision"
)

var update = flag.Bool("update", false, "rewrite golden files")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from golden (-update to accept):\n%s", name, got)
	}
}

var testForwards = []Forward{
	{Name: "proxmox-api", HostAddr: "127.0.0.1", HostPort: 18006, GuestPort: 8006},
	{Name: "sandbox-api", HostAddr: "127.0.0.1", HostPort: 18443, GuestPort: 8443},
}

func TestQEMUArgsGolden(t *testing.T) {
	n := Node{Name: "pve1", CPUs: 4, MemoryMiB: 8192, Accel: "kvm", Forwards: testForwards, Dir: "/var/lib/pve-bootstrap/nested/pve1"}
	args, err := n.Spec().Args()
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "qemu-args.golden", []byte(strings.Join(args, "\n")+"\n"))

	bad := []VMSpec{
		{Name: "PVE", Disk: "d", Seed: "s", CPUs: 1, MemoryMiB: 512, Accel: "kvm"},
		{Name: "a", Disk: "d,x", Seed: "s", CPUs: 1, MemoryMiB: 512, Accel: "kvm"},
		{Name: "a", Disk: "d", Seed: "s", CPUs: 1, MemoryMiB: 512, Accel: "xen"},
		{Name: "a", Disk: "d", Seed: "s", CPUs: 1, MemoryMiB: 512, Accel: "kvm", Forwards: []Forward{{HostAddr: "::1", HostPort: 1, GuestPort: 1}}},
		{Name: "a", Disk: "d", Seed: "s", CPUs: 1, MemoryMiB: 512, Accel: "kvm", Forwards: []Forward{testForwards[0], testForwards[0]}},
	}
	for _, s := range bad {
		if _, err := s.Args(); err == nil {
			t.Errorf("accepted %+v", s)
		}
	}
}

func TestCheckNested(t *testing.T) {
	mk := func(files map[string]string) string {
		root := t.TempDir()
		for p, c := range files {
			full := filepath.Join(root, p)
			os.MkdirAll(filepath.Dir(full), 0o755)
			os.WriteFile(full, []byte(c), 0o644)
		}
		return root
	}
	for _, tc := range []struct {
		name  string
		files map[string]string
		ok    bool
		want  string
	}{
		{"intel on", map[string]string{"sys/module/kvm_intel/parameters/nested": "Y\n", "dev/kvm": ""}, true, ""},
		{"amd on", map[string]string{"sys/module/kvm_amd/parameters/nested": "1\n", "dev/kvm": ""}, true, ""},
		{"intel off", map[string]string{"sys/module/kvm_intel/parameters/nested": "N\n", "dev/kvm": ""}, false, "options kvm_intel nested=1"},
		{"no module", map[string]string{}, false, "neither kvm_intel nor kvm_amd"},
		{"no device", map[string]string{"sys/module/kvm_intel/parameters/nested": "Y\n"}, false, "/dev/kvm"},
	} {
		err := CheckNested(mk(tc.files))
		var ne *NestedError
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case !tc.ok && (!errors.As(err, &ne) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func imageServer(t *testing.T, image []byte, sumFor []byte) *httptest.Server {
	sum := sha512.Sum512(sumFor)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/SHA512SUMS":
			fmt.Fprintf(w, "%s  debian-13-genericcloud-amd64.json\n%s  debian-13-genericcloud-amd64.qcow2\n", strings.Repeat("0", 128), hex.EncodeToString(sum[:]))
		case "/debian-13-genericcloud-amd64.qcow2":
			w.Write(image)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestImageFetchVerifies(t *testing.T) {
	img := []byte("QFI\xfb fake image")
	ctx := context.Background()
	srv := imageServer(t, img, img)
	im := Image{URL: srv.URL + "/debian-13-genericcloud-amd64.qcow2", SumsURL: srv.URL + "/SHA512SUMS"}
	cache := t.TempDir()
	p, err := im.Fetch(ctx, srv.Client(), cache)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); !bytes.Equal(b, img) {
		t.Error("cached image differs")
	}
	// A tampered image is refused and nothing lands in the cache.
	bad := imageServer(t, []byte("evil"), img)
	im = Image{URL: bad.URL + "/debian-13-genericcloud-amd64.qcow2", SumsURL: bad.URL + "/SHA512SUMS"}
	cache2 := t.TempDir()
	_, err = im.Fetch(ctx, bad.Client(), cache2)
	var ce *ChecksumError
	if !errors.As(err, &ce) {
		t.Errorf("tampered image: %v", err)
	}
	if ents, _ := os.ReadDir(cache2); len(ents) != 0 {
		t.Errorf("cache holds %v after a bad download", ents)
	}
	if _, err := ExpectedSHA512([]byte("abc  other.qcow2\n"), "debian.qcow2"); err == nil {
		t.Error("missing entry accepted")
	}
}

func TestManagerCreateCloneDelete(t *testing.T) {
	ctx := context.Background()
	img := []byte("QFI\xfb fake image")
	srv := imageServer(t, img, img)
	sys := t.TempDir()
	os.MkdirAll(filepath.Join(sys, "sys/module/kvm_intel/parameters"), 0o755)
	os.WriteFile(filepath.Join(sys, "sys/module/kvm_intel/parameters/nested"), []byte("Y\n"), 0o644)
	os.MkdirAll(filepath.Join(sys, "dev"), 0o755)
	os.WriteFile(filepath.Join(sys, "dev/kvm"), nil, 0o644)
	rec := &provision.RecordingRunner{Replies: []*provision.Reply{{Prefix: "qemu-img"}, {Prefix: "qemu-system-x86_64"}}}
	m := &Manager{Dir: t.TempDir(), Runner: rec, HTTP: srv.Client(), SysRoot: sys}
	ud := []byte("#cloud-config\n")
	n, err := m.Create(ctx, CreateOptions{
		Name: "pve1", Image: Image{URL: srv.URL + "/debian-13-genericcloud-amd64.qcow2", SumsURL: srv.URL + "/SHA512SUMS"},
		CacheDir: t.TempDir(), UserData: ud, CPUs: 2, MemoryMiB: 4096, DiskGiB: 64, Forwards: testForwards,
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := rec.Lines()
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "qemu-img create -f qcow2 -F qcow2 -b ") || !strings.HasSuffix(lines[0], filepath.Join(n.Dir, "disk.qcow2")+" 64G") {
		t.Errorf("commands %q", lines)
	}
	if !strings.Contains(lines[1], "-accel kvm -cpu host") || !strings.HasSuffix(lines[1], "-daemonize") {
		t.Errorf("qemu command %q", lines[1])
	}
	if _, err := m.Create(ctx, CreateOptions{Name: "pve1", DiskGiB: 64, UserData: ud}); err == nil {
		t.Error("second create with the same name accepted")
	}

	c, err := m.Clone(ctx, "pve1", "pve2", []Forward{{Name: "proxmox-api", HostAddr: "127.0.0.1", HostPort: 28006, GuestPort: 8006}})
	if err != nil {
		t.Fatal(err)
	}
	if c.InstanceID == n.InstanceID || !strings.HasPrefix(c.InstanceID, "pve2-") || c.ClonedFrom != "pve1" {
		t.Errorf("clone %+v", c)
	}
	if l := rec.Lines()[2]; !strings.HasPrefix(l, "qemu-img convert -O qcow2 "+filepath.Join(n.Dir, "disk.qcow2")) {
		t.Errorf("clone copy %q", l)
	}
	seed, _ := os.ReadFile(filepath.Join(c.Dir, "seed.iso"))
	if !bytes.Contains(seed, []byte("instance-id: "+c.InstanceID)) || bytes.Contains(seed, []byte(n.InstanceID)) {
		t.Error("clone seed does not carry its own instance id")
	}
	nodes, err := m.List()
	if err != nil || len(nodes) != 2 || nodes[0].Name != "pve1" || nodes[1].Name != "pve2" {
		t.Errorf("list %+v %v", nodes, err)
	}
	if err := m.Delete(ctx, "pve2"); err != nil {
		t.Fatal(err)
	}
	nodes, _ = m.List()
	if len(nodes) != 1 || slices.ContainsFunc(nodes, func(n Node) bool { return n.Name == "pve2" }) {
		t.Errorf("after delete: %+v", nodes)
	}
	if err := m.Delete(ctx, "../etc"); err == nil {
		t.Error("delete with a path name accepted")
	}

	// Nested off: create refuses before touching anything.
	os.WriteFile(filepath.Join(sys, "sys/module/kvm_intel/parameters/nested"), []byte("N\n"), 0o644)
	_, err = m.Create(ctx, CreateOptions{Name: "pve3", DiskGiB: 64, UserData: ud, CPUs: 1, MemoryMiB: 1024})
	var ne *NestedError
	if !errors.As(err, &ne) {
		t.Errorf("nested off: %v", err)
	}
	if _, err := os.Stat(filepath.Join(m.Dir, "pve3")); err == nil {
		t.Error("pve3 directory left behind")
	}
}
