package testvm

import (
	"os"
	"path/filepath"
	"testing"

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
