package ctguest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// bedCTs is a test bed running unprivileged containers (stopped with the
// bed when the test ends) and a Client for them.
type bedCTs struct {
	bed *testvm.Bed
	c   *Client
	cts map[int]*testvm.Container
}

// startCTs starts a bed and a container per spec (Rootfs and Disk are
// filled in). It needs root, lxc and debootstrap: without root it skips
// loudly unless CI is set; under CI a missing prerequisite fails.
func startCTs(ctx context.Context, t *testing.T, specs ...testvm.ContainerSpec) *bedCTs {
	t.Helper()
	testkit.RequireRoot(t, "lxc-start", "lxc-attach", "lxc-info", "lxc-stop", "debootstrap", "nsenter")
	rootfs, err := testvm.CTRootfs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	// KillGrace a minute, not the default 10 s: on a loaded machine the
	// killed processes of an exec can take longer to be gone, and the
	// call would give its exec cgroup up, left for the next test to find
	e := &bedCTs{bed: b, cts: map[int]*testvm.Container{},
		c: New(Options{LXCPath: b.LXCPath(), Prefix: b.LXCPrefix(), CgroupDir: b.ContainerCgroupV2, KillGrace: time.Minute})}
	for _, s := range specs {
		s.Rootfs, s.Disk = rootfs, filepath.Join(t.TempDir(), "disk")
		ct, err := b.StartContainer(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		e.cts[s.VMID] = ct
	}
	return e
}

// sh runs a shell command in container vmid as its root and returns its
// stdout; anything but exit 0 fails the test.
func (e *bedCTs) sh(ctx context.Context, t *testing.T, vmid int, cmd string, args ...string) string {
	t.Helper()
	res, err := e.c.Guest(vmid).Exec(ctx, sandbox.GuestExec{Argv: append([]string{"sh", "-c", cmd, "sh"}, args...), Timeout: 60})
	if err != nil {
		t.Fatalf("%q: %v", cmd, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("%q: exit %d: %s", cmd, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

// raw runs argv in container vmid with lxc-attach alone (no script, no
// /bin/sh: what a test uses to mend a container it broke).
func (e *bedCTs) raw(ctx context.Context, t *testing.T, vmid int, argv ...string) {
	t.Helper()
	cmd := append(e.bed.LXCPrefix(), "lxc-attach", "-P", e.bed.LXCPath(), "-n", strconv.Itoa(vmid), "--clear-env", "--")
	if out, err := exec.CommandContext(ctx, cmd[0], append(cmd[1:], argv...)...).CombinedOutput(); err != nil {
		t.Fatalf("lxc-attach %q: %v: %s", argv, err, out)
	}
}

// execCgroups lists the exec cgroups in container vmid's cgroup.
func (e *bedCTs) execCgroups(t *testing.T, vmid int) []string {
	t.Helper()
	dir := e.bed.ContainerCgroupV2(vmid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range ents {
		if d.IsDir() && strings.HasPrefix(d.Name(), execPrefix) {
			out = append(out, filepath.Join(dir, d.Name()))
		}
	}
	return out
}

// ctProcs lists the host pids of the processes in container vmid's pid
// namespace whose command line holds match.
func (e *bedCTs) ctProcs(t *testing.T, vmid int, match string) []int {
	t.Helper()
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", e.cts[vmid].PID))
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); l != ns {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if bytes.Contains(cmdline, []byte(match)) && !zombie(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// zombie reports whether pid has exited and waits for its parent.
func zombie(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(data, ')')
	return i < 0 || i+2 >= len(data) || data[i+2] == 'Z' || data[i+2] == 'X'
}

// status is the first field of a line of /proc/<pid>/status ("" when the
// process is gone).
func status(pid int, key string) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				return f[0]
			}
		}
	}
	return ""
}

// nothingLeft checks that no exec cgroup and no process whose command
// line holds match is left in container vmid.
func (e *bedCTs) nothingLeft(t *testing.T, vmid int, match string) {
	t.Helper()
	if left := e.execCgroups(t, vmid); len(left) != 0 {
		t.Errorf("exec cgroups left: %v", left)
	}
	if left := e.ctProcs(t, vmid, match); len(left) != 0 {
		t.Errorf("processes %q left in the container: %v", match, left)
	}
}

// testCtx is a context that ends with the test or after d.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
