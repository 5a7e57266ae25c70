package kvm

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"

	"github.com/pve-inspect/pve-inspect/cloud/kvm/internal/seedcheck"
)

// TestSeedcheckReadsSeed checks, on the host, the reader the guest init
// uses: the digest it computes from our ISO is the digest of what we wrote.
func TestSeedcheckReadsSeed(t *testing.T) {
	iso := filepath.Join(t.TempDir(), "seed.iso")
	ud, md := []byte("#cloud-config\n{}\n"), MetaData("tcg-1", "tcg")
	if err := WriteSeedISO(iso, Seed{UserData: ud, MetaData: md}); err != nil {
		t.Fatal(err)
	}
	got, err := seedcheck.Read(iso)
	if err != nil {
		t.Fatal(err)
	}
	if want := seedcheck.Summary(SeedLabel, ud, md); got != want {
		t.Errorf("read %q, want %q", got, want)
	}
	if _, err := seedcheck.Read("/dev/null"); err == nil {
		t.Error("/dev/null read as a seed")
	}
}

// TestBootTCG boots QEMU with software emulation (never KVM: nested KVM is
// not available on every CI machine) using the command line VMSpec
// generates, a Debian kernel from /boot and a tiny initramfs whose init
// (internal/testinit) finds the seed disk and answers on the forwarded
// ports. It proves the seed disk and both host forwards are wired.
func TestBootTCG(t *testing.T) {
	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	for _, bin := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(bin); err != nil {
			kernels = nil
		}
	}
	if len(kernels) == 0 {
		msg := "TestBootTCG needs qemu-system-x86_64, qemu-img and a kernel in /boot/vmlinuz-* (Debian package linux-image-amd64)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPING: " + msg)
	}
	slices.Sort(kernels)
	kernel := kernels[len(kernels)-1]
	kver := strings.TrimPrefix(filepath.Base(kernel), "vmlinuz-")
	dir := t.TempDir()
	start := time.Now()

	// The guest's init, static.
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

	disk := filepath.Join(dir, "disk.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-f", "qcow2", disk, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v\n%s", err, out)
	}
	ud, md := []byte("#cloud-config\n# boot test\n"), MetaData("tcgtest-0001", "tcgtest")
	seed := filepath.Join(dir, "seed.iso")
	if err := WriteSeedISO(seed, Seed{UserData: ud, MetaData: md}); err != nil {
		t.Fatal(err)
	}
	fw := []Forward{
		{Name: "proxmox-api", HostAddr: "127.0.0.1", HostPort: freePort(t), GuestPort: 8006},
		{Name: "sandbox-api", HostAddr: "127.0.0.1", HostPort: freePort(t), GuestPort: 8443},
	}
	serial := filepath.Join(dir, "serial.log")
	spec := VMSpec{
		Name: "tcgtest", Disk: disk, Seed: seed, CPUs: 1, MemoryMiB: 512, Accel: "tcg", Forwards: fw,
		SerialLog: serial, PIDFile: filepath.Join(dir, "qemu.pid"), QMPSocket: filepath.Join(dir, "qmp.sock"),
		Kernel: kernel, Initrd: initrd, Append: "console=ttyS0 panic=-1 pvetest.ports=8006,8443",
	}
	args, err := spec.Args()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(args, "tcg") || slices.Contains(args, "kvm") {
		t.Fatalf("not a TCG command line: %q", args)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var qout bytes.Buffer
	q := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	q.Stdout, q.Stderr = &qout, &qout
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- q.Wait() }()
	t.Cleanup(func() {
		q.Process.Kill()
		<-exited
	})

	// Wait for the init's verdict on the serial console.
	var log []byte
	for {
		log, _ = os.ReadFile(serial)
		if bytes.Contains(log, []byte("testinit: READY")) {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("qemu exited: %v\n%s\nserial:\n%s", err, qout.String(), tail(log))
		case <-ctx.Done():
			t.Fatalf("guest not ready before the test's bound\nserial:\n%s", tail(log))
		case <-time.After(250 * time.Millisecond):
		}
	}
	// The seed is the second virtio disk; the first is the (blank) qcow2.
	want := seedcheck.Summary(SeedLabel, ud, md)
	if !bytes.Contains(log, []byte("testinit: SEED-OK dev=/dev/vd")) || !bytes.Contains(log, []byte(want)) {
		t.Fatalf("serial console lacks SEED-OK %q:\n%s", want, tail(log))
	}
	for _, f := range fw {
		line := dialLine(ctx, t, fmt.Sprintf("127.0.0.1:%d", f.HostPort))
		if !strings.HasPrefix(line, fmt.Sprintf("PORT %d SEED-OK ", f.GuestPort)) || !strings.HasSuffix(line, want) {
			t.Errorf("host port %d answered %q", f.HostPort, line)
		}
	}
	t.Logf("TCG boot with seed and forwards verified in %s (kernel %s)", time.Since(start).Round(time.Second), kver)
}

func tail(b []byte) string {
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// dialLine connects through a host forward and reads the guest's line,
// retrying while the guest side is not yet answering.
func dialLine(ctx context.Context, t *testing.T, addr string) string {
	var last error
	for ctx.Err() == nil {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err == nil {
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err == nil {
				return strings.TrimSpace(line)
			}
			last = err
		} else {
			last = err
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("%s: %v", addr, last)
	return ""
}

// kernelModules resolves the named modules and their dependencies from
// /lib/modules/<ver>/modules.dep (built-in ones are skipped) and returns
// them decompressed, with their load order.
func kernelModules(t *testing.T, ver string, names ...string) (map[string][]byte, []string) {
	base := filepath.Join("/lib/modules", ver)
	norm := func(p string) string {
		b := filepath.Base(p)
		for _, ext := range []string{".xz", ".zst", ".gz"} {
			b = strings.TrimSuffix(b, ext)
		}
		return strings.ReplaceAll(strings.TrimSuffix(b, ".ko"), "-", "_")
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(base, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			builtin[norm(l)] = true
		}
	}
	deps := map[string][]string{}
	paths := map[string]string{}
	b, err := os.ReadFile(filepath.Join(base, "modules.dep"))
	if err != nil {
		t.Logf("no %s/modules.dep (%v): assuming the drivers are built in", base, err)
		return nil, nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		mod, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n := norm(mod)
		paths[n] = mod
		for _, d := range strings.Fields(rest) {
			deps[n] = append(deps[n], norm(d))
			paths[norm(d)] = d
		}
	}
	out := map[string][]byte{}
	var order []string
	seen := map[string]bool{}
	var visit func(n string)
	visit = func(n string) {
		if seen[n] || builtin[n] {
			return
		}
		seen[n] = true
		p, ok := paths[n]
		if !ok {
			t.Fatalf("module %s: neither built in nor in modules.dep", n)
		}
		for _, d := range deps[n] {
			visit(d)
		}
		out[n+".ko"] = readModule(t, filepath.Join(base, p))
		order = append(order, n+".ko")
	}
	for _, n := range names {
		visit(n)
	}
	return out, order
}

func readModule(t *testing.T, p string) []byte {
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var r io.Reader
	switch {
	case strings.HasSuffix(p, ".xz"):
		r, err = xz.NewReader(bytes.NewReader(raw))
	case strings.HasSuffix(p, ".zst"):
		var z *zstd.Decoder
		z, err = zstd.NewReader(bytes.NewReader(raw))
		r = z
	case strings.HasSuffix(p, ".gz"):
		r, err = gzip.NewReader(bytes.NewReader(raw))
	default:
		return raw
	}
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return b
}

// writeInitramfs writes a cpio (newc) archive: the init, the modules and
// the mount points.
func writeInitramfs(t *testing.T, path, initBin string, mods map[string][]byte, order []string) {
	var buf bytes.Buffer
	ino := 1
	entry := func(name string, mode uint32, rmajor, rminor int, data []byte) {
		fmt.Fprintf(&buf, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, mode, 0, 0, 1, 0, len(data), 0, 0, rmajor, rminor, len(name)+1, 0)
		ino++
		buf.WriteString(name + "\x00")
		for buf.Len()%4 != 0 {
			buf.WriteByte(0)
		}
		buf.Write(data)
		for buf.Len()%4 != 0 {
			buf.WriteByte(0)
		}
	}
	const dir, reg, chr = 0o040000, 0o100000, 0o020000
	for _, d := range []string{"dev", "proc", "sys", "modules"} {
		entry(d, dir|0o755, 0, 0, nil)
	}
	entry("dev/console", chr|0o600, 5, 1, nil)
	init, err := os.ReadFile(initBin)
	if err != nil {
		t.Fatal(err)
	}
	entry("init", reg|0o755, 0, 0, init)
	for _, m := range order {
		entry("modules/"+m, reg|0o644, 0, 0, mods[m])
	}
	entry("modules/order", reg|0o644, 0, 0, []byte(strings.Join(order, "\n")+"\n"))
	entry("TRAILER!!!", 0, 0, 0, nil)
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
