package pveemu

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// ctSnapshots lists a CT's snapshots by name (GET .../snapshot).
func ctSnapshots(e *env, vmid string) map[string]map[string]any {
	e.t.Helper()
	out := map[string]map[string]any{}
	for _, s := range e.ok("GET", "/nodes/pve/lxc/"+vmid+"/snapshot", nil).([]any) {
		m := s.(map[string]any)
		out[m["name"].(string)] = m
	}
	return out
}

// TestCTSnapshotRollback: a CT snapshot (a vzsnapshot task) keeps the
// config and the CT's own volume; a rollback (vzrollback) brings both
// back, keeps the current description and sets parent; the refusals of
// snapshot_create and snapshot_rollback, each where pve-container makes
// it (the request, or the task); a rollback with start stops a running
// CT and starts it again in a vzstart task of its own.
func TestCTSnapshotRollback(t *testing.T) {
	e := ctEnv(t)
	e.ctClone("101", nil)
	ct := "/nodes/pve/lxc/101"
	marker := filepath.Join(e.s.DiskDir(101), "marker")
	if err := os.WriteFile(marker, []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st := e.task("POST", ct+"/snapshot", url.Values{"snapname": {"s1"}, "description": {"clean"}}); st != "OK" {
		t.Fatalf("snapshot: %s", st)
	}
	snaps := ctSnapshots(e, "101")
	if s1 := snaps["s1"]; s1 == nil || s1["description"] != "clean" || s1["parent"] != nil || s1["snapstate"] != nil {
		t.Errorf("snapshot list: %v", snaps)
	}
	if cur := snaps["current"]; cur["parent"] != "s1" || cur["running"] != float64(0) {
		t.Errorf("current: %v", cur)
	}
	if c := ctConfig(e, 101, url.Values{"snapshot": {"s1"}}); c["memory"] != float64(512) || c["description"] != "clean" || c["snaptime"] == nil || c["lock"] != nil {
		t.Errorf("the snapshot's config: %v", c)
	}
	e.ok("PUT", ct+"/config", url.Values{"memory": {"256"}, "description": {"now"}})
	if err := os.WriteFile(marker, []byte("after"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st := e.task("POST", ct+"/snapshot/s1/rollback", nil); st != "OK" {
		t.Fatalf("rollback: %s", st)
	}
	c := ctConfig(e, 101, nil)
	if c["memory"] != float64(512) || c["description"] != "now" || c["parent"] != "s1" || c["lock"] != nil {
		t.Errorf("config after the rollback: %v", c)
	}
	if b, _ := os.ReadFile(marker); string(b) != "before" {
		t.Errorf("volume after the rollback: %q", b)
	}
	if err := e.s.AddCTTemplate(9101, "other", t.TempDir(), nil); err != nil {
		t.Fatal(err)
	}
	if st := e.task("POST", "/nodes/pve/lxc/101/clone", url.Values{"newid": {"111"}, "storage": {dirStorage}}); st != "OK" {
		t.Fatalf("full clone to %s: %s", dirStorage, st)
	}
	for _, c := range []struct {
		name         string
		method, path string
		form         url.Values
		status       int    // the request's refusal; 0: a task
		want         string // its reason, or the task's exit status
	}{
		{"reserved name", "POST", ct + "/snapshot", url.Values{"snapname": {"current"}}, 500, "unable to use snapshot name 'current' (reserved name)"},
		{"name taken", "POST", ct + "/snapshot", url.Values{"snapname": {"s1"}}, 0, "snapshot name 's1' already used"},
		{"a template", "POST", "/nodes/pve/lxc/9101/snapshot", url.Values{"snapname": {"s1"}}, 0, "you can't take a snapshot if it's a template"},
		{"no such CT", "POST", "/nodes/pve/lxc/555/snapshot", url.Values{"snapname": {"s1"}}, 0, "Configuration file 'nodes/pve/lxc/555.conf' does not exist"},
		{"a VM's id", "POST", "/nodes/pve/lxc/9000/snapshot", url.Values{"snapname": {"s1"}}, 500, "Configuration file 'nodes/pve/lxc/9000.conf' does not exist"},
		{"dir storage (raw)", "POST", "/nodes/pve/lxc/111/snapshot", url.Values{"snapname": {"s1"}}, 0, "snapshot feature is not available"},
		{"no such snapshot", "POST", ct + "/snapshot/nope/rollback", nil, 0, "snapshot 'nope' does not exist"},
		{"rollback of a template", "POST", "/nodes/pve/lxc/9101/snapshot/s1/rollback", nil, 0, "you can't rollback if vm is a template"},
		{"rollback of no CT", "POST", "/nodes/pve/lxc/555/snapshot/s1/rollback", nil, 0, "Configuration file 'nodes/pve/lxc/555.conf' does not exist"},
		{"snapshot config of none", "GET", ct + "/config", url.Values{"snapshot": {"nope"}}, 500, "snapshot 'nope' does not exist"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.status != 0 {
				e.wantFail(c.method, c.path, c.form, c.status, c.want)
				return
			}
			e.wantTaskFail(c.method, c.path, c.form, c.want)
		})
	}
	if c := ctConfig(e, 101, nil); c["lock"] != nil {
		t.Errorf("a refused snapshot left a lock: %v", c)
	}
	if _, ok := ctSnapshots(e, "101")["s1"]; !ok || len(ctSnapshots(e, "101")) != 2 {
		t.Errorf("snapshots after the refusals: %v", ctSnapshots(e, "101"))
	}

	// A running CT: snapshot, then a rollback with start stops it, rolls
	// back and has a vzstart task of its own start it.
	if st := e.task("POST", ct+"/status/start", nil); st != "OK" {
		t.Fatal(st)
	}
	if st := e.task("POST", ct+"/snapshot", url.Values{"snapname": {"s2"}}); st != "OK" {
		t.Fatalf("snapshot of a running CT: %s", st)
	}
	if p := ctSnapshots(e, "101")["s2"]["parent"]; p != "s1" {
		t.Errorf("s2's parent %v", p)
	}
	if st := e.task("POST", ct+"/snapshot/s1/rollback", url.Values{"start": {"1"}}); st != "OK" {
		t.Fatalf("rollback with start: %s", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var starts []string
	for ctx.Err() == nil {
		starts = starts[:0]
		for _, tk := range e.ok("GET", "/cluster/tasks", nil).([]any) {
			if m := tk.(map[string]any); m["type"] == "vzstart" && m["id"] == "101" {
				starts = append(starts, m["upid"].(string))
			}
		}
		if len(starts) == 2 && e.s.ctRunning(101) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(starts) != 2 || !e.s.ctRunning(101) {
		t.Fatalf("after a rollback with start: vzstart tasks %v, running %v; want a second vzstart and the CT running", starts, e.s.ctRunning(101))
	}
	if c := ctConfig(e, 101, nil); c["parent"] != "s1" {
		t.Errorf("parent after the rollback: %v", c["parent"])
	}
}

// TestCTSnapshotRaces: what the config lock does to calls racing a CT
// snapshot ("lock: snapshot" from prepare to commit) and a rollback
// ("lock: rollback" around the volume's rollback), and the migration lock
// to two rollbacks: the second waits for the first ("trying to acquire
// lock...") and then runs.
func TestCTSnapshotRaces(t *testing.T) {
	e := ctEnv(t)
	e.ctClone("101", nil)
	ct := "/nodes/pve/lxc/101"
	if st := e.task("POST", ct+"/status/start", nil); st != "OK" {
		t.Fatal(st)
	}
	held, release := e.s.HoldCTSnapshots()
	snap, _ := e.ok("POST", ct+"/snapshot", url.Values{"snapname": {"s1"}}).(string)
	<-held
	e.wantTaskFail("POST", ct+"/snapshot", url.Values{"snapname": {"s2"}}, "CT is locked (snapshot)")
	e.wantTaskFail("POST", ct+"/status/stop", nil, "CT is locked (snapshot)")
	e.wantFail("PUT", ct+"/config", url.Values{"memory": {"256"}}, 500, "CT is locked (snapshot)")
	e.wantFail("DELETE", ct, url.Values{"force": {"1"}}, 500, "CT is locked (snapshot)")
	e.wantTaskFail("POST", ct+"/snapshot/s1/rollback", nil, "unable to rollback to incomplete snapshot (snapstate = prepare)")
	if s1 := ctSnapshots(e, "101")["s1"]; s1["snapstate"] != "prepare" {
		t.Errorf("s1 while it is taken: %v", s1)
	}
	if c := ctConfig(e, 101, nil); c["lock"] != "snapshot" {
		t.Errorf("config while a snapshot is taken: %v", c)
	}
	release()
	if st := e.wait(snap); st != "OK" {
		t.Fatalf("held snapshot: %s", st)
	}
	if c := ctConfig(e, 101, nil); c["lock"] != nil || c["parent"] != "s1" {
		t.Errorf("config after the snapshot: %v", c)
	}

	held, release = e.s.HoldCTSnapshots()
	defer release()
	first, _ := e.ok("POST", ct+"/snapshot/s1/rollback", nil).(string)
	<-held
	if e.s.ctRunning(101) {
		t.Error("the rollback did not stop the CT")
	}
	e.wantTaskFail("POST", ct+"/status/start", nil, "CT is locked (rollback)")
	e.wantTaskFail("POST", ct+"/snapshot", url.Values{"snapname": {"s3"}}, "CT is locked (rollback)")
	e.wantFail("PUT", ct+"/config", url.Values{"memory": {"256"}}, 500, "CT is locked (rollback)")
	e.wantFail("DELETE", ct, nil, 500, "CT is locked (rollback)")
	second, _ := e.ok("POST", ct+"/snapshot/s1/rollback", nil).(string)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	waiting := func() bool {
		for {
			lines := e.taskLogLines("pve", second)
			switch {
			case slices.Contains(lines, "trying to acquire lock..."):
				return true
			case ctx.Err() != nil || slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "TASK ") }):
				return false
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !waiting() {
		t.Fatalf("the second rollback does not wait for the migration lock: %v", e.taskLogLines("pve", second))
	}
	release()
	for _, upid := range []string{first, second} {
		if st := e.wait(upid); st != "OK" {
			t.Errorf("rollback %s: %s", upid, st)
		}
	}
	if c := ctConfig(e, 101, nil); c["lock"] != nil || c["parent"] != "s1" || strings.Contains(c["rootfs"].(string), "snap") {
		t.Errorf("config after two rollbacks: %v", c)
	}
}
