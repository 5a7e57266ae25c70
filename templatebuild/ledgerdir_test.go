package templatebuild_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/templatebuild"
)

// TestLedgerDirOthersCannotWrite: the build ledger is what makes a VM a
// build's (the name and tags alone are the sandbox token's to set): a
// [templates] state_dir another user can write, or a symlink to a
// directory of theirs, would let them record any VM as a build's template
// to be reused and granted, or as a half-built one to be destroyed. The
// ledger is neither read nor written there; the default under root's
// /var/lib, and a root-only directory under a sticky /tmp, are taken.
func TestLedgerDirOthersCannotWrite(t *testing.T) {
	testkit.RequireRoot(t, "chown")
	base := t.TempDir()
	theirs := filepath.Join(base, "theirs")
	if err := os.Mkdir(theirs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(theirs, link); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir, says string
	}{
		{"owned by another user", theirs, "owned by uid 65534"},
		{"a symlink", link, "symlink"},
		{"under a directory others write", filepath.Join(open, "ledger"), "writable by others"},
		{"writable by others", open, "writable by others"},
	} {
		h := templatebuild.NodeHost{StateDir: tc.dir}
		err := h.Record(130, templatebuild.Record{Name: "t1", State: templatebuild.StateTemplate})
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: record: %v, want refused saying %q", tc.name, err, tc.says)
		}
		if _, _, err := h.Recorded(130); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: read: %v, want refused saying %q", tc.name, err, tc.says)
		}
	}
	if _, err := os.Stat(filepath.Join(theirs, "130.json")); err == nil {
		t.Error("a record was written in another user's directory")
	}
	ok := templatebuild.NodeHost{StateDir: filepath.Join(base, "ours", "ledger")}
	if err := ok.Record(130, templatebuild.Record{Name: "t1", State: templatebuild.StateTemplate}); err != nil {
		t.Fatalf("a root-only ledger under a sticky /tmp: %v", err)
	}
	if r, found, err := ok.Recorded(130); err != nil || !found || r.Name != "t1" {
		t.Errorf("read back: %+v %v %v", r, found, err)
	}
}
