package kvm

import (
	"context"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/cloud/kvm/internal/seedcheck"
	"github.com/pve-inspect/pve-inspect/cloud/kvm/libvirtdtest"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// testImage serves a small locally made qcow2 as the Debian image, with
// its SHA512SUMS.
func testImage(t *testing.T) Image {
	t.Helper()
	base := filepath.Join(t.TempDir(), "debian-13-genericcloud-amd64.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-f", "qcow2", base, "64M").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	img, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	srv := imageServer(t, img, img)
	return Image{URL: srv.URL + "/debian-13-genericcloud-amd64.qcow2", SumsURL: srv.URL + "/SHA512SUMS"}
}

// bootFiles builds the boot test's kernel and initramfs: a Debian kernel
// from /boot and internal/testinit as PID 1, which prints SEED-OK with the
// seed's digest on the serial console.
func bootFiles(t *testing.T) *directBoot {
	t.Helper()
	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(kernels) == 0 {
		msg := "no kernel in /boot/vmlinuz-* (Debian package linux-image-amd64)"
		if testkit.InCI() {
			t.Fatal(msg)
		}
		t.Skip("SKIPPING: " + msg)
	}
	slices.Sort(kernels)
	kernel := kernels[len(kernels)-1]
	kver := strings.TrimPrefix(filepath.Base(kernel), "vmlinuz-")
	dir := t.TempDir()
	initBin := filepath.Join(dir, "init")
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	gocmd := exec.Command(goBin, "build", "-o", initBin, "./internal/testinit")
	gocmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := gocmd.CombinedOutput(); err != nil {
		t.Fatalf("build testinit: %v\n%s", err, out)
	}
	initrd := filepath.Join(dir, "initrd.cpio")
	mods, order := kernelModules(t, kver, "virtio_pci", "virtio_blk", "virtio_net")
	writeInitramfs(t, initrd, initBin, mods, order)
	return &directBoot{kernel: kernel, initrd: initrd, cmdline: "console=ttyS0 panic=-1"}
}

func testConfig(d *libvirtdtest.Daemon, sysRoot string) Config {
	return Config{
		URI: d.URI, Network: DefaultNetwork, Bridge: DefaultBridge,
		// The network lives in the daemon's own namespace: it routes
		// nowhere but the namespace.
		Subnet: netip.MustParsePrefix("10.251.19.0/24"),
		Pool:   DefaultPool, PoolDir: filepath.Join(d.Dir, "pool"), LogDir: filepath.Join(d.Dir, "serial"),
		SysRoot: sysRoot, HTTP: http.DefaultClient,
	}
}

// nestedSys is a /sys and /dev fixture with kvm_intel's nested parameter.
func nestedSys(t *testing.T, nested string) string {
	sys := t.TempDir()
	os.MkdirAll(filepath.Join(sys, "sys/module/kvm_intel/parameters"), 0o755)
	os.WriteFile(filepath.Join(sys, "sys/module/kvm_intel/parameters/nested"), []byte(nested+"\n"), 0o644)
	os.MkdirAll(filepath.Join(sys, "dev"), 0o755)
	os.WriteFile(filepath.Join(sys, "dev/kvm"), nil, 0o644)
	return sys
}

// waitSeed waits until the node's serial log shows the guest read the
// seed with this user-data and meta-data.
func waitSeed(ctx context.Context, t *testing.T, n Node, ud []byte) {
	t.Helper()
	want := "SEED-OK dev=/dev/vdb " + seedcheck.Summary(SeedLabel, ud, MetaData(n.InstanceID, n.Name))
	libvirtdtest.WaitFor(ctx, t, n.Name+" serial console shows "+want, func() (bool, string) {
		b, _ := os.ReadFile(n.SerialLog)
		return strings.Contains(string(b), want), string(b)
	})
}

// TestLibvirtNodeLifecycle runs every verb against a libvirtd the test
// starts, booting a tiny guest under TCG (never KVM: nested KVM is not
// available everywhere): create, list (also through virsh), stop, clone,
// start, delete, and the bad input that must change nothing.
func TestLibvirtNodeLifecycle(t *testing.T) {
	testkit.RequireRoot(t, libvirtdtest.Tools()...)
	d := libvirtdtest.Start(t)
	boot := bootFiles(t)
	img := testImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	m, err := Dial(ctx, testConfig(d, nestedSys(t, "Y")))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ud := []byte("#cloud-config\n# libvirt lifecycle test\n")
	opts := func(name string) CreateOptions {
		return CreateOptions{Name: name, Image: img, CacheDir: filepath.Join(d.Dir, "cache-img"), UserData: ud,
			CPUs: 1, MemoryMiB: 512, DiskGiB: 8, Accel: "tcg", kernel: boot}
	}
	empty := d.Inventory(t)

	// Bad input before anything exists: each a clear error, nothing made.
	bad := []struct {
		name string
		mgr  *Manager
		o    CreateOptions
		want func(error) bool
		text string
	}{
		{"unknown network", m, func() CreateOptions { o := opts("n1"); o.Network = "nosuchnet"; return o }(),
			func(err error) bool { return errors.Is(err, ErrUnknownNetwork) }, "nosuchnet"},
		{"bad name", m, opts("Bad_Name"), func(err error) bool { return err != nil }, "lowercase"},
		{"tiny disk", m, func() CreateOptions { o := opts("n1"); o.DiskGiB = 1; return o }(), func(err error) bool { return err != nil }, "at least 8"},
	}
	mOff, err := Dial(ctx, testConfig(d, nestedSys(t, "N")))
	if err != nil {
		t.Fatal(err)
	}
	defer mOff.Close()
	kvmOpts := opts("n1")
	kvmOpts.Accel = "kvm"
	bad = append(bad, struct {
		name string
		mgr  *Manager
		o    CreateOptions
		want func(error) bool
		text string
	}{"no nested virtualization", mOff, kvmOpts, func(err error) bool { var ne *NestedError; return errors.As(err, &ne) }, "nested=N"})
	for _, tc := range bad {
		_, err := tc.mgr.Create(ctx, tc.o)
		if !tc.want(err) || err == nil || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: got %v, want an error naming %q", tc.name, err, tc.text)
		}
		if inv := d.Inventory(t); inv != empty {
			t.Errorf("%s: the daemon now holds:\n%s", tc.name, inv)
		}
	}
	cfg := testConfig(d, "/")
	cfg.URI = "qemu:///system?socket=" + filepath.Join(d.Dir, "run", "no-such-sock")
	if _, err := Dial(ctx, cfg); err == nil || !strings.Contains(err.Error(), "is libvirtd running") {
		t.Errorf("unreachable libvirtd: %v", err)
	} else {
		var ue *UnreachableError
		if !errors.As(err, &ue) {
			t.Errorf("unreachable libvirtd: %T, want *UnreachableError", err)
		}
	}

	// A failure late in create (the domain does not start) takes back the
	// network, pool, volumes, reservation and domain it made.
	broken := opts("n1")
	broken.kernel = &directBoot{kernel: filepath.Join(d.Dir, "no-such-kernel"), initrd: boot.initrd, cmdline: boot.cmdline}
	if _, err := m.Create(ctx, broken); err == nil || !strings.Contains(err.Error(), "start") {
		t.Errorf("create with a missing kernel: %v", err)
	}
	if inv := d.Inventory(t); inv != empty {
		t.Errorf("a failed create left:\n%s", inv)
	}
	if _, err := os.Stat(filepath.Join(d.Dir, "pool")); !os.IsNotExist(err) {
		t.Errorf("a failed create left the pool directory: %v", err)
	}

	// A domain that is not ours stays invisible to list and untouched.
	foreign := `<domain type='qemu'><name>foreign</name><memory unit='MiB'>64</memory><os><type arch='x86_64' machine='q35'>hvm</type></os></domain>`
	fx := filepath.Join(d.Dir, "foreign.xml")
	os.WriteFile(fx, []byte(foreign), 0o600)
	d.Virsh(t, "define", fx)
	if err := m.Delete(ctx, "foreign"); !errors.Is(err, ErrNotOurs) {
		t.Errorf("delete of a foreign domain: %v", err)
	}

	n1, err := m.Create(ctx, opts("n1"))
	if err != nil {
		t.Fatal(err)
	}
	first, last := reservedRange(cfg.Subnet)
	a1 := netip.MustParseAddr(n1.Address)
	if !n1.Running || !n1.Autostart || a1.Compare(first) < 0 || a1.Compare(last) > 0 || n1.APIURL != "https://"+n1.Address+":8006/" {
		t.Errorf("created %+v", n1)
	}
	waitSeed(ctx, t, n1, ud)
	if out := d.Virsh(t, "list", "--name"); !strings.Contains(out, "n1") {
		t.Errorf("virsh list:\n%s", out)
	}
	if out := d.Virsh(t, "ttyconsole", "n1"); !strings.HasPrefix(out, "/dev/pts/") {
		t.Errorf("virsh ttyconsole (what virsh console attaches to): %q", out)
	}
	if out := d.Virsh(t, "metadata", "n1", MetadataURI); !strings.Contains(out, "<instance-id>"+n1.InstanceID+"</instance-id>") || !strings.Contains(out, n1.Address) {
		t.Errorf("virsh metadata:\n%s", out)
	}
	if out := d.Virsh(t, "net-dumpxml", DefaultNetwork); !strings.Contains(out, fmt.Sprintf("<host mac='%s' name='n1' ip='%s'/>", n1.MAC, n1.Address)) {
		t.Errorf("no DHCP reservation for n1:\n%s", out)
	}
	// libvirt hands the reservation to its dnsmasq.
	if b, err := os.ReadFile(filepath.Join(d.Dir, "lib", "dnsmasq", DefaultNetwork+".hostsfile")); err != nil || !strings.Contains(string(b), n1.MAC+","+n1.Address+",n1") {
		t.Errorf("dnsmasq hosts file: %v\n%s", err, b)
	}
	nodes, err := m.List()
	if err != nil || len(nodes) != 1 || nodes[0].Name != "n1" || nodes[0].State != "running" {
		t.Errorf("list: %+v %v", nodes, err)
	}

	before := d.Inventory(t)
	if _, err := m.Create(ctx, opts("n1")); !errors.Is(err, ErrNameTaken) {
		t.Errorf("second n1: %v", err)
	}
	if _, err := m.Create(ctx, opts("foreign")); !errors.Is(err, ErrNameTaken) {
		t.Errorf("name of a foreign domain: %v", err)
	}
	if inv := d.Inventory(t); inv != before {
		t.Errorf("name taken changed the daemon:\n%s\nwas:\n%s", inv, before)
	}
	if _, err := m.Clone(ctx, "n1", "n2"); err == nil || !strings.Contains(err.Error(), "stop it first") {
		t.Errorf("clone of a running node: %v", err)
	}

	// The test guest ignores ACPI: stop powers it off after the grace.
	if err := m.Stop(ctx, "n1", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if n, _ := m.Get("n1"); n.Running || n.State != "shut off" {
		t.Errorf("after stop: %+v", n)
	}
	n2, err := m.Clone(ctx, "n1", "n2")
	if err != nil {
		t.Fatal(err)
	}
	if n2.InstanceID == n1.InstanceID || n2.Address == n1.Address || n2.MAC == n1.MAC || n2.ClonedFrom != "n1" || !n2.Running {
		t.Errorf("clone %+v of %+v", n2, n1)
	}
	waitSeed(ctx, t, n2, ud)
	if out := d.Virsh(t, "vol-dumpxml", "--pool", DefaultPool, "n2.qcow2"); strings.Contains(out, "<backingStore>") {
		t.Errorf("clone disk still has a backing store:\n%s", out)
	}
	if err := m.Start(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if n, _ := m.Get("n1"); !n.Running {
		t.Errorf("after start: %+v", n)
	}
	logs := []string{n1.SerialLog, n2.SerialLog}
	for _, name := range []string{"n1", "n2"} {
		if err := m.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range logs {
		if _, err := os.Stat(l); !os.IsNotExist(err) {
			t.Errorf("serial log %s left: %v", l, err)
		}
	}
	// What remains is the network, the pool and the verified base image:
	// shared by every node, no trace of n1 or n2, and the foreign domain.
	inv := d.Inventory(t)
	sum := sha512.New()
	b, _ := os.ReadFile(filepath.Join(d.Dir, "cache-img", "debian-13-genericcloud-amd64.qcow2"))
	sum.Write(b)
	want := fmt.Sprintf("domain foreign\nnetwork %s\npool %s\n  volume debian-13-genericcloud-amd64-%s.qcow2\n", DefaultNetwork, DefaultPool, hex.EncodeToString(sum.Sum(nil))[:16])
	if inv != want {
		t.Errorf("after delete the daemon holds:\n%s\nwant:\n%s", inv, want)
	}

	// A base volume whose bytes are not the verified image is refused.
	vol := filepath.Join(d.Dir, "pool", fmt.Sprintf("debian-13-genericcloud-amd64-%s.qcow2", hex.EncodeToString(sum.Sum(nil))[:16]))
	f, err := os.OpenFile(vol, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("tampered"), 4096)
	f.Close()
	if _, err := m.Create(ctx, opts("n3")); err == nil || !strings.Contains(err.Error(), "is not the verified image") {
		t.Errorf("create on a tampered base volume: %v", err)
	}
	if inv := d.Inventory(t); inv != want {
		t.Errorf("refused create changed the daemon:\n%s", inv)
	}
}
