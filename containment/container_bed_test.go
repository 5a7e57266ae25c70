package containment

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/containment/probe"
	"github.com/pve-inspect/pve-inspect/containment/probebuild"
	"github.com/pve-inspect/pve-inspect/ctguest"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// containerPlan is a plan of the container rows alone (no network rows:
// the bed's containers here have no NIC), the proc-sys and sysfs rows
// opening paths (nil: the check's own).
func containerPlan(procSys, sysfs []string) *Plan {
	p := &Plan{Policy: "container walls"}
	addContainer(func(c Check) {
		c.Target.ID = "c" + strconv.Itoa(len(p.Checks)+1)
		switch {
		case c.Target.Kind == probe.KindProcSys && procSys != nil:
			c.Target.Paths = procSys
		case c.Target.Kind == probe.KindSysfs && sysfs != nil:
			c.Target.Paths = sysfs
		}
		p.Checks = append(p.Checks, c)
	})
	return p
}

// containerVerdicts runs plan in g and returns the container rows'
// observed verdicts by probe kind (the table logged).
func containerVerdicts(ctx context.Context, t *testing.T, r *Runner, g Guest, plan *Plan) map[probe.Kind]Row {
	t.Helper()
	res, err := r.Run(ctx, g, plan)
	if err != nil {
		t.Fatalf("containment run: %v", err)
	}
	var buf bytes.Buffer
	if err := res.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", buf.String())
	out := map[probe.Kind]Row{}
	for _, row := range res.Rows {
		if row.Group == GroupContainer {
			out[row.kind] = row
		}
	}
	if len(out) != len(probe.LocalKinds) {
		t.Fatalf("%d container rows, want %d", len(out), len(probe.LocalKinds))
	}
	return out
}

// TestBedContainerRows: the container rows run by the real probe in real
// unprivileged LXC containers on the bed, entered as the daemon enters
// them (ctguest, EngineGuest):
//
//   - a container as pve-container makes one for the daemon (no features,
//     its default id map): every row denied;
//   - each wall removed, the row that watches it fails: the keyctl
//     feature (no seccomp rule) opens the keyring row, the nesting
//     feature (lxc's fully visible proc and sysfs) the nesting row, an id
//     map passing the node's uid and gid 1000 through the idmap row, and
//     a path the container may write (its own network namespace's
//     sysctl, its loopback's sysfs attribute) given to the proc-sys and
//     sysfs rows makes them allowed;
//   - the probe run by the node's root itself (every wall missing: no
//     user namespace, seccomp filter or read-only mount) fails every row,
//     the mount and module rows too; a kernel without module support
//     (no /proc/modules) answers the module calls ENOSYS, which is no
//     verdict, so that row reads error there, never denied.
func TestBedContainerRows(t *testing.T) {
	testkit.RequireRoot(t, "lxc-start", "lxc-attach", "lxc-info", "lxc-stop", "debootstrap", "nsenter")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	rootfs, err := testvm.CTRootfs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := testvm.Up(ctx, testvm.Options{Logger: testkit.FailureLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	cts := ctguest.New(ctguest.Options{LXCPath: b.LXCPath(), Prefix: b.LXCPrefix(), CgroupDir: b.ContainerCgroupV2})
	passThrough := []string{"u 0 100000 1000", "g 0 100000 1000", "u 1000 1000 1", "g 1000 1000 1",
		"u 1001 101001 64535", "g 1001 101001 64535"}
	specs := map[string]testvm.ContainerSpec{
		"as pve-container makes it": {VMID: 401},
		"keyctl and nesting":        {VMID: 402, Features: testvm.ContainerFeatures{Keyctl: true, Nesting: true}},
		"node id 1000 passed":       {VMID: 403, IDMap: passThrough},
	}
	for _, s := range specs {
		s.Rootfs, s.Disk = rootfs, filepath.Join(t.TempDir(), "disk")
		if _, err := b.StartContainer(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	r := &Runner{ProbePath: probebuild.ForTest(t), GuestDir: "/tmp"}
	run := func(vmid int, plan *Plan) map[probe.Kind]Row {
		return containerVerdicts(ctx, t, r, EngineGuest{Guest: cts.Guest(vmid)}, plan)
	}

	for kind, row := range run(401, containerPlan(nil, nil)) {
		if row.Status != Pass || row.Observed != Denied {
			t.Errorf("unprivileged container: %s: %s %s (%s), want denied", kind, row.Observed, row.Status, row.Detail)
		}
	}

	got := run(402, containerPlan(nil, nil))
	for kind, want := range map[probe.Kind]Verdict{probe.KindKeyring: Allowed, probe.KindNesting: Allowed, probe.KindIDMap: Denied,
		probe.KindModule: Denied, probe.KindMount: Denied} {
		if row := got[kind]; row.Observed != want {
			t.Errorf("keyctl and nesting features: %s: %s (%s), want %s", kind, row.Observed, row.Detail, want)
		}
	}
	if row := got[probe.KindNesting]; !strings.Contains(row.Why, "LEAK") {
		t.Errorf("nesting row's why %q", row.Why)
	}

	got = run(403, containerPlan(nil, nil))
	if row := got[probe.KindIDMap]; row.Observed != Allowed || !strings.Contains(row.Detail, "uid 1000 is node uid 1000") {
		t.Errorf("id map passing 1000 through: %s (%s), want allowed naming uid 1000", row.Observed, row.Detail)
	}

	got = run(401, containerPlan([]string{"/proc/sys/net/ipv4/ip_forward"}, []string{"/sys/devices/virtual/net/lo/tx_queue_len"}))
	for _, kind := range []probe.Kind{probe.KindProcSys, probe.KindSysfs} {
		if row := got[kind]; row.Observed != Allowed {
			t.Errorf("a path the container may write: %s: %s (%s), want allowed", kind, row.Observed, row.Detail)
		}
	}

	// the node's root: the probe in a network namespace of the node's,
	// nothing else between it and the kernel
	g := &nsGuest{ns: testkit.NewNetNS(t, "pvei-ctw")}
	node := &Runner{ProbePath: r.ProbePath, GuestDir: t.TempDir()}
	_, noModules := os.Stat("/proc/modules")
	for kind, row := range containerVerdicts(ctx, t, node, g, containerPlan(nil, nil)) {
		want := Allowed
		if kind == probe.KindModule && noModules != nil {
			want = Errored
		}
		if row.Observed != want || row.Status == Pass {
			t.Errorf("the node's root: %s: %s %s (%s), want %s", kind, row.Observed, row.Status, row.Detail, want)
		}
	}
}
