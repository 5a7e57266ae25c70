package testvm

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestSweepOrphanCgroups: the cgroup subtree of a bed whose node
// namespace is gone is removed, scopes and all; a bed whose node
// namespace exists keeps its subtree.
func TestSweepOrphanCgroups(t *testing.T) {
	testkit.RequireRoot(t)
	hs := cgroupHierarchies()
	if len(hs) == 0 {
		t.Fatal("no cgroup hierarchy found")
	}
	root := t.TempDir()
	// A stand-in for /run/netns: the live bed has its node namespace.
	if err := os.WriteFile(filepath.Join(root, "pttstlive-node"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sweepCgroups("pttstlive"); _ = sweepCgroups("pttstgone") })
	for _, name := range []string{"pttstlive", "pttstgone"} {
		for _, h := range hs {
			if err := os.MkdirAll(filepath.Join(cgroupRoot, h, "pvei-bed-"+name, "qemu.slice", "101.scope"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Only this test's names: the machine's live beds are not this test's.
	if err := sweepOrphanCgroups(root, "pttst*"); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(cgroupRoot, h, "pvei-bed-pttstgone")); !os.IsNotExist(err) {
			t.Errorf("%s: the orphan subtree is still there (%v)", h, err)
		}
		if _, err := os.Stat(filepath.Join(cgroupRoot, h, "pvei-bed-pttstlive", "qemu.slice", "101.scope")); err != nil {
			t.Errorf("%s: the live bed's scope was removed: %v", h, err)
		}
	}
}

// TestSweepThawsFrozenCgroups: a bed swept while one of its cgroups is
// frozen (its owner died during a container snapshot's freeze) is swept
// whole: the frozen process is thawed, killed, and every cgroup of the
// subtree removed. Without the thaw its process cannot die and the
// sweep fails "device or resource busy", as a CI run did.
func TestSweepThawsFrozenCgroups(t *testing.T) {
	testkit.RequireRoot(t)
	const name = "pttstfrozen"
	t.Cleanup(func() { _ = sweepCgroups(name) })
	var frozen []string // the cgroup dirs the process is in, frozen ones first
	for _, h := range allHierarchies() {
		if !slices.Contains([]string{"", "unified", "freezer", "cpu"}, h) {
			continue // the freezers, and one the frozen process holds busy (cpuset wants its cpus set first)
		}
		d := filepath.Join(cgroupRoot, h, "pvei-bed-"+name, "lxc", "101", "ns")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		frozen = append(frozen, d)
	}
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	pid := strconv.Itoa(cmd.Process.Pid)
	froze := 0
	for _, d := range frozen {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(pid), 0o644); err != nil {
			t.Fatalf("join %s: %v", d, err)
		}
	}
	for _, d := range frozen {
		for file, val := range map[string]string{"freezer.state": "FROZEN", "cgroup.freeze": "1"} {
			if _, err := os.Stat(filepath.Join(d, file)); err != nil {
				continue
			}
			if err := os.WriteFile(filepath.Join(d, file), []byte(val), 0o644); err != nil {
				t.Fatalf("freeze %s: %v", d, err)
			}
			froze++
		}
	}
	if froze == 0 {
		t.Fatal("no freezer found: neither freezer.state (v1) nor cgroup.freeze (v2)")
	}
	if err := sweepCgroups(name); err != nil {
		t.Fatalf("sweep of a bed with a frozen cgroup: %v", err)
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the frozen process outlived the sweep")
	}
	for _, h := range allHierarchies() {
		if _, err := os.Stat(filepath.Join(cgroupRoot, h, "pvei-bed-"+name)); !os.IsNotExist(err) {
			t.Errorf("%s: the subtree is still there (%v)", h, err)
		}
	}
}
