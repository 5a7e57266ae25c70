package ctguest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// nestedInit is the init of a privileged container (a pid namespace of
// the node's own user namespace) that moved itself into a user namespace
// of its own making, mapped as Proxmox maps an unprivileged container: a
// helper still in the node's user namespace writes the maps, then the
// init execs on. lxc-attach follows the init's namespaces, so the probe
// reports the same maps.
const nestedInit = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe(); r2, w2 = os.pipe()
if os.fork() == 0:
    os.read(r, 1)
    for f in ("uid_map", "gid_map"):
        with open("/proc/1/" + f, "w") as fh:
            fh.write("0 100000 65536\n")
    os.write(w2, b"x"); os._exit(0)
if libc.unshare(0x10000000) != 0:
    sys.exit("unshare: %d" % ctypes.get_errno())
os.write(w, b"x"); os.read(r2, 1); os.wait()
os.execvp("sleep", ["sleep", "300"])
`

// TestNodeIDMapsInitLeftItsUserNamespace (review, helper-65): NodeIDMaps reads the
// maps of the user namespace the container's init is in now, which the
// container's root chooses: the init of a privileged container (the
// node's root) that unshared a user namespace mapped 0 -> 100000 reads
// as an unprivileged container, and the id map row passes. The init
// cannot leave its pid namespace, whose user namespace is the one lxc
// made (NS_GET_USERNS on /proc/<pid>/ns/pid): an init whose user
// namespace is another one must not be read as the container's.
func TestNodeIDMapsInitLeftItsUserNamespace(t *testing.T) {
	testkit.RequireRoot(t, "unshare", "python3", "sleep")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	script := filepath.Join(dir, "init.py")
	if err := os.WriteFile(script, []byte(nestedInit), 0o644); err != nil {
		t.Fatal(err)
	}
	ct := exec.CommandContext(ctx, "unshare", "--pid", "--fork", "--mount-proc", "python3", script)
	if err := ct.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ct.Process.Kill(); _ = ct.Wait() })
	// the container's init: unshare's child, once its maps are written
	var pid int
	for pid == 0 {
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(ct.Process.Pid), "task", strconv.Itoa(ct.Process.Pid), "children"))
		if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			if exe, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(p), "exe")); strings.HasSuffix(exe, "/sleep") {
				pid = p
				break
			}
		}
		select {
		case <-ctx.Done():
			t.Fatal("the container's init did not start")
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Cleanup(func() {
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
		}
	})
	// lxc's monitor names that pid
	info := "#!/bin/sh\necho " + strconv.Itoa(pid) + "\n"
	if err := os.WriteFile(filepath.Join(dir, "lxc-info"), []byte(info), 0o755); err != nil {
		t.Fatal(err)
	}
	c := New(Options{LXCAttach: filepath.Join(dir, "lxc-attach")})
	uid, gid, err := c.Guest(342).NodeIDMaps(ctx)
	if err == nil || !strings.Contains(err.Error(), "not in the user namespace its pid namespace belongs to") {
		t.Errorf("the maps of an init that left the user namespace of its pid namespace: uid_map %q, gid_map %q, %v; want them refused as not the container's", uid, gid, err)
	}
}
