package ctguest

import (
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestReviewCgroupNSEscape: an exec's root makes a cgroup namespace of
// its own (rooted at the exec cgroup), mounts cgroup2 there and tries to
// write what it sees: a child cgroup, cgroup.procs, cgroup.kill,
// cgroup.freeze, a limit; and clone3-free moves through /proc. Nothing
// may be writable; the exec ends with its timeout and nothing is left.
func TestReviewCgroupNSEscape(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	e := startCTs(ctx, t, testvm.ContainerSpec{VMID: 358})
	g := e.c.Guest(358)
	script := `cat /proc/self/cgroup
unshare -C -m sh -c '
mount -t cgroup2 none /mnt 2>&1 || { echo MOUNT-FAILED; exit 0; }
cat /proc/self/cgroup; ls -ln /mnt | head -30
mkdir /mnt/sub 2>&1 && echo MKDIR-OK
for f in cgroup.procs cgroup.kill cgroup.freeze cgroup.subtree_control memory.max pids.max; do
  [ -e /mnt/$f ] || continue
  if echo 1 > /mnt/$f 2>/dev/null; then echo WROTE-$f; fi
done
ls -ld /mnt
'
(setsid sleep 35801 &) ; sleep 35802`
	res, err := g.Exec(ctx, sandbox.GuestExec{Argv: []string{"sh", "-c", script}, Timeout: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("exit %d timed out %v\nstdout:\n%s\nstderr:\n%s", res.ExitCode, res.TimedOut, res.Stdout, res.Stderr)
	for _, bad := range []string{"MKDIR-OK", "WROTE-"} {
		if contains(string(res.Stdout), bad) {
			t.Errorf("%s in the exec's own cgroup namespace", bad)
		}
	}
	e.nothingLeft(t, 358, "3580")
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
