package kvm

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func TestSeedISOReadBack(t *testing.T) {
	if _, err := exec.LookPath("xorriso"); err != nil {
		if testkit.InCI() {
			t.Fatal("xorriso not installed (CI)")
		}
		t.Skip("SKIPPING: xorriso not installed")
	}
	dir := t.TempDir()
	iso := filepath.Join(dir, "seed.iso")
	ud := []byte("Content-Type: multipart/mixed; boundary=\"x\"\n\n--x--\n")
	md := MetaData("pve1-0a1b2c3d", "pve1")
	if err := WriteSeedISO(iso, Seed{UserData: ud, MetaData: md}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if b, err := exec.Command("xorriso", "-indev", iso, "-osirrox", "on", "-extract", "/", out).CombinedOutput(); err != nil {
		t.Fatalf("xorriso extract: %v\n%s", err, b)
	}
	for name, want := range map[string][]byte{"user-data": ud, "meta-data": md} {
		got, err := os.ReadFile(filepath.Join(out, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %q %v", name, got, err)
		}
	}
	b, err := exec.Command("xorriso", "-indev", iso, "-pvd_info").CombinedOutput()
	if err != nil || !bytes.Contains(b, []byte("Volume Id    : "+SeedLabel)) {
		t.Errorf("volume id not %s:\n%s", SeedLabel, b)
	}
	if err := WriteSeedISO(iso, Seed{MetaData: md}); err == nil {
		t.Error("seed without user-data accepted")
	}
}
