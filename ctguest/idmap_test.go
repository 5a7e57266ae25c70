package ctguest

import (
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestNodeIDMaps: the node reads a running container's id maps from its
// init (the pid lxc's monitor gives): Proxmox's unprivileged map, 0 to
// 100000 for 65536 ids, whatever the container's root does to what it
// shows of itself (a bind mount over its own /proc/self/uid_map changes
// its report, not the node's reading); a stopped container has none.
func TestNodeIDMaps(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	e := startCTs(ctx, t, testvm.ContainerSpec{VMID: 341, Hostname: "ctg-idmap"})
	g := e.c.Guest(341)
	want := []string{"0", "100000", "65536"}
	check := func(what string) {
		t.Helper()
		uid, gid, err := g.NodeIDMaps(ctx)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s: uid_map %q gid_map %q", what, uid, gid)
		for _, m := range []string{uid, gid} {
			if f := strings.Fields(m); len(f) != 3 || f[0] != want[0] || f[1] != want[1] || f[2] != want[2] {
				t.Errorf("%s: the node reads %q, want %v", what, m, want)
			}
		}
	}
	check("an untouched container")
	// the container's root makes its own processes report the node's root
	e.sh(ctx, t, 341, `printf '0 0 4294967295\n' > /tmp/fake && mount --bind /tmp/fake /proc/self/uid_map 2>/dev/null || mount --bind /tmp/fake /proc/1/uid_map 2>/dev/null || true`)
	check("a container that bind-mounted over its map")
	if err := e.bed.StopContainer(ctx, 341); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.NodeIDMaps(ctx); err == nil {
		t.Error("a stopped container's maps were read")
	}
}
