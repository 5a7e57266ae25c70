package templatebuild

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestFindTakesOnlyTheBuildsVMs: name and tags are VM.Config.Options,
// which the daemon's sandbox token (VM.Allocate and VM.Config.Options on
// its pool) holds. The find step reuses a template, or destroys a
// half-built VM, only when the build ledger records it under the name,
// it is in no pool (a build's create names none) and, for a template,
// it passes the hardened profile (the Result carries the report);
// anything else of the name stops the build and is left alone.
func TestFindTakesOnlyTheBuildsVMs(t *testing.T) {
	tags := "builtin-debian13;inspect;pvei-template"
	withPool := func(c map[string]string) map[string]string { c["pool"] = "pve-inspect"; return c }
	unhardened := func(c map[string]string) map[string]string { c["vga"], c["args"] = "std", "-no-reboot"; return c }
	for _, tc := range []struct {
		name   string
		conf   map[string]string
		rec    *Record
		reused bool
		// wantErr is a part of the error ("" for a reuse).
		wantErr string
	}{
		{"a recorded hardened template", builtTemplate("t1", tags), &Record{Name: "t1", State: StateTemplate}, true, ""},
		{"an unrecorded template", builtTemplate("t1", tags), nil, false, "no build on this node recorded it"},
		{"a template recorded under another name", builtTemplate("t1", tags), &Record{Name: "t2", State: StateTemplate}, false, "no build on this node recorded it"},
		{"a recorded template in a pool", withPool(builtTemplate("t1", tags)), &Record{Name: "t1", State: StateTemplate}, false, "it is in a pool"},
		{"a recorded template outside the hardened profile", unhardened(builtTemplate("t1", tags)), &Record{Name: "t1", State: StateTemplate}, false, "no longer in the hardened profile"},
		{"an unrecorded building VM", map[string]string{"name": "t1", "tags": TagBuilding, "status": "running"}, nil, false, "no build on this node recorded it"},
		{"a recorded building VM in a pool", map[string]string{"name": "t1", "tags": TagBuilding, "status": "running", "pool": "pve-inspect"}, &Record{Name: "t1", State: StateBuilding}, false, "it is in a pool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld()
			w.pve.vms[130] = tc.conf
			if tc.rec != nil {
				w.host.ledger[130] = *tc.rec
			}
			res, out, err := runReview(t, w)
			if slices.Contains(w.pve.calls, "delete 130") {
				t.Errorf("VM 130 destroyed:\n%s", out)
			}
			if tc.reused {
				if err != nil || !res.Reused || res.VMID != 130 || len(res.Report.Items) == 0 || len(res.Report.TemplateFailures()) > 0 {
					t.Errorf("want VM 130 reused with its report: %+v %v\n%s", res, err, out)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || res.Reused {
				t.Errorf("VM 130 (%v, record %v): %+v %v, want refused %q\n%s", tc.conf, tc.rec, res, err, tc.wantErr, out)
			}
			if slices.ContainsFunc(w.pve.calls, func(c string) bool { return strings.HasPrefix(c, "create ") }) {
				t.Errorf("a build went on beside VM 130: %v", w.pve.calls)
			}
		})
	}
}

// TestBuildRecordsItsVMs: the build records its VM as building before
// the create and as a template at the seal (with its image's digest); a failed build that destroys
// its VM forgets it.
func TestBuildRecordsItsVMs(t *testing.T) {
	w := newWorld()
	if _, out, err := runReview(t, w); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r := w.host.ledger[100]; r != (Record{Name: "t1", State: StateTemplate, Image: "sha512:" + sumA}) {
		t.Errorf("ledger after the build: %v", w.host.ledger)
	}
	w = newWorld()
	w.agent.replies["cloud-init"] = AgentResult{Exit: 1, Output: "status: error"}
	if _, _, err := runReview(t, w); err == nil {
		t.Fatal("cloud-init error: the build passed")
	}
	if len(w.host.ledger) != 0 || w.pve.vms[100] != nil {
		t.Errorf("after a failed build: ledger %v, VM %v", w.host.ledger, w.pve.vms[100])
	}
}

// TestBuildStopsWhenItsVMChanges: between its steps the build's VM may
// be renamed or moved into a pool by others (VM.Config.Options,
// Pool.Allocate); the seal and the conversion check it is still the
// build's first, and a failed build leaves a VM that is no longer its
// own alone.
func TestBuildStopsWhenItsVMChanges(t *testing.T) {
	w := newWorld()
	// The check step's agent call renames the VM.
	w.agent.hook = func() {
		w.pve.mu.Lock()
		defer w.pve.mu.Unlock()
		if c := w.pve.vms[100]; c != nil {
			c["name"] = "other"
		}
	}
	_, out, err := runReview(t, w)
	if err == nil || !strings.Contains(err.Error(), "no longer this build's") {
		t.Fatalf("build of a VM renamed meanwhile: %v\n%s", err, out)
	}
	for _, c := range w.pve.calls {
		if strings.HasPrefix(c, "shutdown") || strings.HasPrefix(c, "template") || c == "delete 100" {
			t.Errorf("call %q on a VM no longer the build's", c)
		}
	}
}

// TestNodeHostLedger: the ledger is one root-only file a VM in a 0700
// directory; a VM without one is not recorded.
func TestNodeHostLedger(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	n := NodeHost{StateDir: dir}
	if _, ok, err := n.Recorded(7); ok || err != nil {
		t.Fatalf("empty ledger: %v %v", ok, err)
	}
	if err := n.Record(7, Record{Name: "t1", State: StateBuilding}); err != nil {
		t.Fatal(err)
	}
	if r, ok, err := n.Recorded(7); !ok || err != nil || r != (Record{Name: "t1", State: StateBuilding}) {
		t.Errorf("recorded: %v %v %v", r, ok, err)
	}
	for p, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, filepath.Join(dir, "7.json"): 0o600} {
		if st, err := os.Stat(p); err != nil || st.Mode() != want {
			t.Errorf("%s: %v %v, want %v", p, st.Mode(), err, want)
		}
	}
	if err := n.Forget(7); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := n.Recorded(7); ok {
		t.Error("forgotten VM still recorded")
	}
	if _, _, err := (NodeHost{}).Recorded(7); err == nil {
		t.Error("no state directory: no error")
	}
}
