package ctguest

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
)

// fakeAttach stands in for lxc-attach on the host: it skips lxc-attach's
// options up to "--", then does what its mode ($FAKE_MODE is not set:
// the mode is the -n argument, the container's "vmid") says and runs the
// script. Modes: 1 fails as lxc-attach does when it cannot attach; 2
// prints garbage; 3 leaves a process outside the exec cgroup holding the
// output pipes ($OTHER names that cgroup's directory, passed as -P); 4
// prints its environment and cgroup on stderr first.
const fakeAttach = `#!/bin/sh
lxcpath= mode=
while [ $# -gt 0 ] && [ "$1" != -- ]; do
	case $1 in -P) lxcpath=$2; shift;; -n) mode=$2; shift;; esac
	shift
done
shift
case $mode in
1) echo "lxc-attach: $mode: attach.c: Failed to get init pid" >&2; exit 1;;
2) echo "not the marker"; exit 0;;
3) sh -c 'echo $$ > "$1/cgroup.procs"; exec sleep 300' holder "$lxcpath" & h=$!
	# the holder leaves the exec cgroup before the command ends (else the
	# exec's end kills it with the cgroup, under load)
	n=0; while ! grep -qx "$h" "$lxcpath/cgroup.procs" && [ $n -lt 1000 ]; do sleep 0.01; n=$((n+1)); done;;
4) env >&2; grep '^0::' /proc/self/cgroup >&2;;
esac
exec "$@"
`

// fakeNode is a container cgroup directory (with its inner "ns") under
// the unified hierarchy and a Client whose lxc-attach is fakeAttach; the
// script then runs on the host, as root, in the exec cgroup.
func fakeNode(t *testing.T) (*Client, string, string) {
	t.Helper()
	testkit.RequireRoot(t, "sh", "sleep")
	root := "/sys/fs/cgroup"
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		root = filepath.Join(root, "unified")
	}
	base := filepath.Join(root, testkit.RandomName("pvei-ctg-"))
	ct, other := filepath.Join(base, "ct"), filepath.Join(base, "other")
	for _, d := range []string{filepath.Join(ct, "ns"), other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range []string{other, filepath.Join(ct, "ns"), ct, base} {
			if err := removeCgroup(d, 10*time.Second); err != nil {
				t.Error(err)
			}
		}
	})
	bin := filepath.Join(t.TempDir(), "lxc-attach")
	if err := os.WriteFile(bin, []byte(fakeAttach), 0o755); err != nil {
		t.Fatal(err)
	}
	c := New(Options{LXCAttach: bin, LXCPath: other, CgroupDir: func(int) string { return ct }, DrainGrace: 200 * time.Millisecond})
	return c, ct, other
}

// TestFakeAttach covers the host side without a container: an
// lxc-attach that cannot attach (no marker, exit 1) is ErrGuestUnavailable
// with its message; output that is not the marker is ErrGuestProtocol;
// lxc-attach runs in a fresh exec cgroup under the container's directory
// with a fixed environment (not the daemon's); a process outside the exec
// cgroup that holds the output pipes delays the result by at most the
// drain grace; the exec cgroup is gone afterwards; a container directory
// whose cgroup.procs others may write, or without the inner cgroup, is
// refused. No goroutine outlives a call.
func TestFakeAttach(t *testing.T) {
	c, ct, other := fakeNode(t)
	t.Setenv("PVE_INSPECT_TEST_SECRET", "s3cr3t")
	ctx := testCtx(t, time.Minute)
	before := runtime.NumGoroutine()
	defer func() {
		// no goroutine outlives a call (deathsig's may still be returning)
		for i := 0; runtime.NumGoroutine() > before; i++ {
			if i == 100 {
				t.Errorf("%d goroutines, %d before the calls", runtime.NumGoroutine(), before)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	if _, err := c.Guest(1).Exec(ctx, sandbox.GuestExec{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrGuestUnavailable) || !strings.Contains(err.Error(), "Failed to get init pid") {
		t.Errorf("attach failure: %v", err)
	}
	if err := c.Guest(1).Ping(ctx); !errors.Is(err, sandbox.ErrGuestUnavailable) {
		t.Errorf("ping: %v", err)
	}
	if _, err := c.Guest(2).Exec(ctx, sandbox.GuestExec{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrGuestProtocol) {
		t.Errorf("garbage: %v", err)
	}
	res, err := c.Guest(4).Exec(ctx, sandbox.GuestExec{Argv: []string{"echo", "hi"}})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != "hi\n" {
		t.Fatalf("exec: %+v %v", res, err)
	}
	env, cg, _ := strings.Cut(string(res.Stderr), "0::")
	env = strings.Replace(env, "PWD=/\n", "", 1) // the fake's sh adds it
	if strings.TrimSpace(env) != hostPath || !strings.Contains(cg, "/ct/"+execPrefix) {
		t.Errorf("lxc-attach's environment and cgroup: %q", res.Stderr)
	}
	res, err = c.Guest(3).Exec(ctx, sandbox.GuestExec{Argv: []string{"echo", "done"}})
	if err != nil || string(res.Stdout) != "done\n" {
		t.Errorf("with an outside holder: %+v %v", res, err)
	}
	if busy, _ := populated(other); !busy {
		t.Error("the outside holder is gone: the test proves nothing")
	}
	if left, _ := filepath.Glob(filepath.Join(ct, execPrefix+"*")); len(left) != 0 {
		t.Errorf("exec cgroups left: %v", left)
	}
	if err := os.Chmod(filepath.Join(ct, "cgroup.procs"), 0o664); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Guest(4).Exec(ctx, sandbox.GuestExec{Argv: []string{"true"}}); err == nil || !strings.Contains(err.Error(), "not host root's alone") {
		t.Errorf("group-writable container cgroup: %v", err)
	}
	_ = os.Chmod(filepath.Join(ct, "cgroup.procs"), 0o644)
	if err := os.Remove(filepath.Join(ct, "ns")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Guest(4).Exec(ctx, sandbox.GuestExec{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrGuestUnavailable) {
		t.Errorf("no inner cgroup: %v", err)
	}
}
