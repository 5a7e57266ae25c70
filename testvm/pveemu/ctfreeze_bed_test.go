package pveemu

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// churnScript runs in the container: it creates and deletes files in
// /root/churn as fast as it can, each round's names new, and counts its
// rounds in /root/count (written by rename, so it is never half there).
const churnScript = `mkdir -p /root/churn
i=0
while :; do
	i=$((i+1))
	for j in 1 2 3 4 5 6 7 8; do echo $i > /root/churn/f$j.$i; done
	rm -f /root/churn/f*.$i
	echo $i > /root/count.new && mv /root/count.new /root/count
done`

// TestCTSnapshotFreezeOnBed snapshots a running container on the bed
// whose process keeps creating and deleting files in its root: each of
// 20 snapshots succeeds (the container is frozen around the copy of its
// volume, as pve-container's __snapshot_freeze does; a live copy fails
// on a file that vanished under it), the container is frozen while the
// copy runs (lxc-info says FROZEN and its loop does not move), and runs
// again after: its loop goes on. A snapshot whose copy fails thaws it too.
func TestCTSnapshotFreezeOnBed(t *testing.T) {
	testkit.RequireRoot(t, "lxc-start", "lxc-info", "lxc-stop", "lxc-attach", "lxc-freeze", "lxc-unfreeze", "debootstrap")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bed, e := ctBedEnv(ctx, t, nil)
	e.ctClone("101", url.Values{"hostname": {"ct101"}})
	ct := "/nodes/pve/lxc/101"
	if st := e.task("POST", ct+"/status/start", nil); st != "OK" {
		t.Fatalf("start: %s", st)
	}
	t.Cleanup(func() { _ = bed.StopContainer(context.Background(), 101) })
	c, ok := bed.Container(101)
	if !ok {
		t.Fatal("the bed runs no container 101")
	}
	lxc := func(tool string, args ...string) (string, error) {
		argv := append(bed.LXCPrefix(), tool, "-P", bed.LXCPath(), "-n", "101")
		out, err := exec.CommandContext(ctx, argv[0], append(argv[1:], args...)...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := lxc("lxc-attach", "--", "/bin/sh", "-c", `/bin/sh -c "$1" </dev/null >/dev/null 2>&1 &`, "sh", churnScript); err != nil {
		t.Fatalf("lxc-attach: %v: %s", err, out)
	}
	countFile := fmt.Sprintf("/proc/%d/root/root/count", c.PID)
	count := func() int {
		b, _ := os.ReadFile(countFile)
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	// moves waits until the loop's count passes from (it runs).
	moves := func(what string, from int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for count() <= from {
			if time.Now().After(deadline) {
				st, _ := lxc("lxc-info", "-s")
				t.Fatalf("%s: the container's loop stays at %d (%s)", what, from, st)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	moves("after the start", 0)
	var during []string
	e.s.mu.Lock()
	e.s.hooks.ctSnapshotFrozen = func(context.Context, int) {
		st, err := lxc("lxc-info", "-s")
		n := count()
		time.Sleep(200 * time.Millisecond)
		if !strings.Contains(st, "FROZEN") || err != nil || count() != n {
			during = append(during, fmt.Sprintf("%q %v, count %d then %d", st, err, n, count()))
		}
	}
	e.s.mu.Unlock()
	for i := range 20 {
		upid := e.ok("POST", ct+"/snapshot", url.Values{"snapname": {fmt.Sprintf("s%d", i)}}).(string)
		if st := e.wait(upid); st != "OK" {
			t.Fatalf("snapshot %d: %s\n%s", i, st, strings.Join(e.taskLogLines("pve", upid), "\n"))
		}
		moves(fmt.Sprintf("after snapshot %d", i), count())
	}
	if len(during) != 0 {
		t.Errorf("not frozen while copied: %v", during)
	}
	// A copy that fails (its destination is a file) thaws the container.
	if err := os.WriteFile(e.s.ctSnapshotDir(101, "bad"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if st := e.task("POST", ct+"/snapshot", url.Values{"snapname": {"bad"}}); !strings.Contains(st, "not a directory") {
		t.Errorf("snapshot with a failing copy: %s", st)
	}
	if st, err := lxc("lxc-info", "-s"); err != nil || !strings.Contains(st, "RUNNING") {
		t.Errorf("after the failed snapshot: %s %v", st, err)
	}
	moves("after the failed snapshot", count())
}
