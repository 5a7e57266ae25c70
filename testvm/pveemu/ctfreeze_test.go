package pveemu

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// freezeCalls are the backend's freeze and thaw calls, in order.
func freezeCalls(fb *FakeBackend) []string {
	var out []string
	for _, c := range fb.Calls() {
		if strings.HasPrefix(c, "freeze-ct ") || strings.HasPrefix(c, "thaw-ct ") {
			out = append(out, c)
		}
	}
	return out
}

// TestCTSnapshotFreeze: a snapshot of a running CT freezes it before the
// copy of its volume and thaws it after (pve-guest-common snapshot_create
// with pve-container's __snapshot_freeze), also when the freeze fails
// (the snapshot fails with it) and when the task is stopped while the CT
// is frozen; a stopped CT is not frozen. A failed snapshot leaves neither
// the snapshot nor the lock.
func TestCTSnapshotFreeze(t *testing.T) {
	e := ctEnv(t)
	e.ctClone("101", nil)
	ct := "/nodes/pve/lxc/101"
	if st := e.task("POST", ct+"/snapshot", url.Values{"snapname": {"stopped"}}); st != "OK" {
		t.Fatalf("snapshot of the stopped CT: %s", st)
	}
	if got := freezeCalls(e.fb); len(got) != 0 {
		t.Errorf("a stopped CT's snapshot froze it: %v", got)
	}
	if st := e.task("POST", ct+"/status/start", nil); st != "OK" {
		t.Fatalf("start: %s", st)
	}
	frozenDuring := false
	e.s.mu.Lock()
	e.s.hooks.ctSnapshotFrozen = func(context.Context, int) { frozenDuring = e.fb.Frozen(101) }
	e.s.mu.Unlock()
	if st := e.task("POST", ct+"/snapshot", url.Values{"snapname": {"running"}}); st != "OK" {
		t.Fatalf("snapshot of the running CT: %s", st)
	}
	if want := []string{"freeze-ct 101", "thaw-ct 101"}; !slices.Equal(freezeCalls(e.fb), want) || !frozenDuring || e.fb.Frozen(101) {
		t.Errorf("calls %v (want %v), frozen during the copy %v, after %v", freezeCalls(e.fb), want, frozenDuring, e.fb.Frozen(101))
	}

	stopped := make(chan struct{})
	cases := []struct {
		name  string
		setup func()
		stop  bool   // stop the task while the CT is frozen
		want  string // the task's exit status
	}{
		{"freeze fails", func() { e.fb.FailFreeze(101, errors.New("Device or resource busy")) }, false, "command failed: Device or resource busy"},
		{"task stopped while frozen", func() {
			e.fb.FailFreeze(101, nil)
			e.s.mu.Lock()
			e.s.hooks.ctSnapshotFrozen = func(ctx context.Context, _ int) {
				close(stopped)
				<-ctx.Done()
			}
			e.s.mu.Unlock()
		}, true, "received interrupt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := len(freezeCalls(e.fb))
			c.setup()
			upid := e.ok("POST", ct+"/snapshot", url.Values{"snapname": {"failed"}}).(string)
			if c.stop {
				<-stopped
				e.ok("DELETE", "/nodes/pve/tasks/"+url.PathEscape(upid), nil)
			}
			if st := e.wait(upid); st != c.want {
				t.Errorf("exit status %q, want %q", st, c.want)
			}
			if got, want := freezeCalls(e.fb)[before:], []string{"freeze-ct 101", "thaw-ct 101"}; !slices.Equal(got, want) || e.fb.Frozen(101) {
				t.Errorf("calls %v, want %v; frozen after: %v", got, want, e.fb.Frozen(101))
			}
			if snaps := ctSnapshots(e, "101"); snaps["failed"] != nil {
				t.Errorf("the failed snapshot is listed: %v", snaps)
			}
			if conf := ctConfig(e, 101, nil); conf["lock"] != nil {
				t.Errorf("lock left: %v", conf["lock"])
			}
		})
	}
}

// TestCTFullCloneStartedSince: a full clone of a stopped CT whose source
// was started (with skiplock, past its "lock: disk") before the copy is
// not a copy of a live volume: clone_vm's worker dies "unexpected state
// change" before its eval, leaving both locks, as pve-container's does.
func TestCTFullCloneStartedSince(t *testing.T) {
	e := ctEnv(t)
	e.ctClone("101", nil)
	e.s.hooks.cloneReserved = func(string, int) {
		if st := e.task("POST", "/nodes/pve/lxc/101/status/start", url.Values{"skiplock": {"1"}}); st != "OK" {
			t.Errorf("start with skiplock: %s", st)
		}
	}
	if st := e.task("POST", "/nodes/pve/lxc/101/clone", url.Values{"newid": {"102"}, "full": {"1"}}); st != "unexpected state change" {
		t.Errorf("clone: %s", st)
	}
	e.s.hooks.cloneReserved = nil
	if src, dst := ctConfig(e, 101, nil), ctConfig(e, 102, nil); src["lock"] != "disk" || dst["lock"] != "create" {
		t.Errorf("locks: source %v, new CT %v", src["lock"], dst["lock"])
	}
}
