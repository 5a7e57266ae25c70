package sysbox

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// start boots a container and closes it at the end of the test.
func start(t *testing.T, o Options) *Container {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

func TestRecipe(t *testing.T) {
	a := RootfsOptions{CacheDir: "/c", Packages: []string{"iproute2", "procps"}}
	b := RootfsOptions{CacheDir: "/c", Packages: []string{"procps", "iproute2", "dbus"}}
	c := RootfsOptions{CacheDir: "/c", Packages: []string{"procps"}}
	if a.RootfsPath() != b.RootfsPath() {
		t.Errorf("same package set, different roots: %s %s", a.RootfsPath(), b.RootfsPath())
	}
	if a.RootfsPath() == c.RootfsPath() {
		t.Errorf("different package sets share root %s", a.RootfsPath())
	}
	if !strings.HasPrefix(a.RootfsPath(), "/c/rootfs-") {
		t.Errorf("root %s not under the cache dir", a.RootfsPath())
	}
	if !strings.Contains(a.Recipe(), "include=dbus,iproute2,procps,systemd,systemd-sysv\n") {
		t.Errorf("recipe %q", a.Recipe())
	}
}

func TestMirrorIn(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, content, want string
	}{
		{"deb822", "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n", "http://mirror.example/debian"},
		{"security only", "Types: deb\nURIs: http://deb.debian.org/debian-security\n", ""},
		{"one-line", "# comment\ndeb [arch=amd64] http://ftp.example/debian bookworm main\n", "http://ftp.example/debian"},
		{"third party", "deb https://packages.cloud.google.com/apt cloud-sdk main\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "_"))
			if err := os.WriteFile(p, []byte(tt.content), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := mirrorIn(p); got != tt.want {
				t.Errorf("mirrorIn = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name string
		o    Options
	}{
		{"empty name", Options{}},
		{"upper-case name", Options{Name: "Box"}},
		{"long name", Options{Name: strings.Repeat("a", 21)}},
		{"unit with slash", Options{Name: "x", Units: map[string]string{"../x.service": ""}}},
		{"enable non-unit", Options{Name: "x", Enable: []string{"x"}}},
		{"relative file", Options{Name: "x", Files: []File{{Path: "etc/x"}}}},
		{"unclean file", Options{Name: "x", Files: []File{{Path: "/etc/../x"}}}},
		{"relative bind target", Options{Name: "x", Binds: []Bind{{Source: "/tmp", Target: "var/lib/vz"}}}},
		{"bind source missing", Options{Name: "x", Binds: []Bind{{Source: "/nonexistent-sysbox", Target: "/var/lib/vz"}}}},
		{"comma cache", Options{Name: "x", Rootfs: RootfsOptions{CacheDir: "/a,b"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Start(context.Background(), tt.o); err == nil {
				t.Fatal("Start accepted bad options")
			}
		})
	}
}

// TestBinds: a read-write bind is shared with the host both ways, a
// read-only one refuses writes, a target through the root's /var/run
// symlink lands in the container's /run (not the host's), and both are back
// after a restart.
func TestBinds(t *testing.T) {
	testkit.RequireRoot(t, "debootstrap", "nsenter", "unshare", "chroot")
	ctx := context.Background()
	rw, ro := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(ro, "sock-stand-in"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := start(t, Options{Name: "binds", NoStandIns: true, Binds: []Bind{
		{Source: rw, Target: "/var/lib/vz"},
		{Source: ro, Target: "/var/run/sysbox-ro", ReadOnly: true},
	}})
	for boot := range 2 {
		if _, err := c.Exec(ctx, "/bin/sh", "-c", "echo from the container > /var/lib/vz/images"); err != nil {
			t.Fatalf("boot %d: write through the rw bind: %v", boot, err)
		}
		if got, err := os.ReadFile(filepath.Join(rw, "images")); err != nil || string(got) != "from the container\n" {
			t.Fatalf("boot %d: host sees %q (%v)", boot, got, err)
		}
		if out, err := c.Exec(ctx, "cat", "/run/sysbox-ro/sock-stand-in"); err != nil || string(out) != "from the host\n" {
			t.Fatalf("boot %d: read through the ro bind: %q %v", boot, out, err)
		}
		if _, err := c.Exec(ctx, "/bin/sh", "-c", "echo x > /run/sysbox-ro/new"); err == nil {
			t.Fatalf("boot %d: the read-only bind took a write", boot)
		}
		if _, err := os.Stat("/run/sysbox-ro"); err == nil {
			t.Fatalf("boot %d: the bind target was made in the host's /run", boot)
		}
		if boot == 0 {
			if err := c.Restart(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The bind is the container's only: the overlay's upper directory has
	// no copy of what was written.
	if _, err := os.Stat(filepath.Join(c.upper(), "var/lib/vz/images")); err == nil {
		t.Error("the write through the bind landed in the overlay")
	}
}

func TestContainerLifecycle(t *testing.T) {
	testkit.RequireRoot(t, "debootstrap", "nsenter", "unshare", "chroot")
	ctx := context.Background()
	c := start(t, Options{
		Name:  "life",
		Units: map[string]string{"hello.service": "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n"},
		Files: []File{{Path: "/usr/lib/sysbox-test/data", Data: []byte("hello\n"), Mode: 0o600}},
	})
	for _, u := range []string{"pveproxy.service", "pvedaemon.service", "dbus.service"} {
		p, err := c.SystemctlShow(ctx, u, "ActiveState", "UnitFileState")
		if err != nil {
			t.Fatal(err)
		}
		if p["ActiveState"] != "active" {
			t.Errorf("%s: ActiveState=%s, want active", u, p["ActiveState"])
		}
	}
	// /lib is a symlink to usr/lib in the root: the pre-boot file must not
	// have shadowed it.
	if out, err := c.Exec(ctx, "stat", "-c", "%F %a", "/lib", "/lib/sysbox-test/data"); err != nil {
		t.Fatal(err)
	} else if got := string(out); got != "symbolic link 777\nregular file 600\n" {
		t.Errorf("stat = %q", got)
	}
	if _, err := c.Exec(ctx, "systemctl", "start", "hello.service"); err != nil {
		t.Fatal(err)
	}
	// The container has its own pid namespace: systemd is PID 1 there.
	if out, err := c.Exec(ctx, "cat", "/proc/1/comm"); err != nil || strings.TrimSpace(string(out)) != "systemd" {
		t.Errorf("PID 1 is %q (%v)", out, err)
	}
	var ee *ExecError
	if _, err := c.Exec(ctx, "false"); !errors.As(err, &ee) {
		t.Errorf("Exec(false) = %v, want *ExecError", err)
	}

	// Files: persistent ones survive a restart, /run does not.
	if err := c.WriteFile(ctx, "/etc/sysbox-test/keep", []byte("keep"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile(ctx, "/run/sysbox-test/gone", []byte("gone"), 0o600); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(host, []byte("#!/bin/sh\necho copied\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.CopyIn(ctx, host, "/usr/local/bin/copied"); err != nil {
		t.Fatal(err)
	}
	if out, err := c.Exec(ctx, "copied"); err != nil || string(out) != "copied\n" {
		t.Errorf("copied binary: %q %v", out, err)
	}
	pid1 := c.PID()
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if c.PID() == pid1 {
		t.Errorf("PID unchanged after restart")
	}
	if err := syscall.Kill(pid1, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("old PID 1 %d still exists: %v", pid1, err)
	}
	if b, err := c.ReadFile(ctx, "/etc/sysbox-test/keep"); err != nil || string(b) != "keep" {
		t.Errorf("after restart /etc file = %q, %v", b, err)
	}
	if _, err := c.ReadFile(ctx, "/run/sysbox-test/gone"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after restart /run file: err = %v, want not exist", err)
	}
	if p, err := c.SystemctlShow(ctx, "pveproxy.service", "ActiveState"); err != nil || p["ActiveState"] != "active" {
		t.Errorf("pveproxy after restart: %v %v", p, err)
	}

	dir, cg, pid := c.dir, c.cgroup, c.PID()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, cg, dir + ".lock"} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after Close %s: %v, want gone", p, err)
		}
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("PID 1 %d still exists after Close: %v", pid, err)
	}
	if _, err := c.Exec(ctx, "true"); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Exec after Close = %v, want ErrNotRunning", err)
	}
}

func TestSweepStale(t *testing.T) {
	testkit.RequireRoot(t, "debootstrap", "nsenter", "unshare", "chroot")
	ctx := context.Background()
	live := start(t, Options{Name: "live", NoStandIns: true})
	stale := start(t, Options{Name: "stale", NoStandIns: true})
	pid := stale.PID()
	// Simulate a killed test run: its lock is released without Close.
	stale.lock.Close()
	stale.lock = nil
	if err := Sweep(""); err != nil {
		t.Fatal(err)
	}
	<-stale.done // reaped by our own Wait goroutine
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("stale PID 1 %d survived the sweep: %v", pid, err)
	}
	for _, p := range []string{stale.dir, stale.cgroup, stale.dir + ".lock"} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after sweep %s: %v, want gone", p, err)
		}
	}
	if _, err := live.Exec(ctx, "true"); err != nil {
		t.Errorf("live container hit by the sweep: %v", err)
	}
	if _, err := os.Stat(live.dir); err != nil {
		t.Errorf("live container's dir: %v", err)
	}
}
