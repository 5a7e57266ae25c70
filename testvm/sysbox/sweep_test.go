package sysbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// helperEnv makes the test binary a helper that starts a container in the
// cache dir named by the variable, prints "PID DIR CGROUP" and waits to be
// killed: a test run that dies without Close.
const helperEnv = "SYSBOX_TEST_OWNER_CACHE"

func TestMain(m *testing.M) {
	if cache := os.Getenv(helperEnv); cache != "" {
		c, err := Start(context.Background(), Options{Name: "orphan", NoStandIns: true, Rootfs: RootfsOptions{CacheDir: cache}})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%d %s %s\n", c.PID(), c.dir, c.cgroup)
		select {}
	}
	os.Exit(m.Run())
}

// gone reports whether pid has exited (a zombie waiting for a reaper that is
// not ours counts as exited).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && (f[0] == "Z" || f[0] == "X")
}

func TestSweepAfterOwnerKilled(t *testing.T) {
	testkit.RequireRoot(t, "debootstrap", "nsenter", "unshare", "chroot")
	ctx := context.Background()
	root, err := EnsureRootfs(ctx, RootfsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A cache dir of our own (sharing the built root), so no other run's
	// sweep can interfere with this one.
	cache := t.TempDir()
	if err := os.Symlink(root, filepath.Join(cache, filepath.Base(root))); err != nil {
		t.Fatal(err)
	}
	owner := exec.Command(os.Args[0], "-test.run=^$")
	owner.Env = append(os.Environ(), helperEnv+"="+cache)
	owner.Stderr = os.Stderr
	out, err := owner.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = owner.Process.Kill(); _ = owner.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("owner: %v", err)
	}
	var pid int
	var dir, cg string
	if _, err := fmt.Sscan(line, &pid, &dir, &cg); err != nil {
		t.Fatalf("owner said %q: %v", line, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL); _ = killCgroup(cg, true) })

	if err := owner.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = owner.Wait()
	if gone(pid) {
		t.Fatal("the container died with its owner; nothing left to sweep (test premise broken)")
	}
	if err := Sweep(cache); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for !gone(pid) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if !gone(pid) {
		t.Errorf("container PID 1 %d survived the sweep", pid)
	}
	for _, p := range []string{dir, dir + ".lock", cg} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after the sweep %s: %v, want gone", p, err)
		}
	}
}
