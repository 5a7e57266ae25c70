package pveemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// CT snapshots (pve-container API2/LXC/Snapshot.pm on pve-guest-common
// AbstractConfig.pm): a snapshot is taken in three steps, each of the
// first and last under the CT's config lock: prepare (the config gets
// "lock: snapshot" and the snapshot's section, snapstate "prepare"), the
// volume snapshot (no config lock held, the config's lock keeps the
// others out), commit (lock and snapstate gone, parent set). A rollback
// is two config-locked steps around the volume's rollback ("lock:
// rollback" between them), all under the guest's migration lock. A
// volume snapshot is a copy of the CT's own layer (DiskDir) in
// snap-<name>, as a VM's.

// reCTSnapVolume matches a CT volume lvmthin can snapshot: a volume of its
// own on the thin pool (vm-<vmid>-disk-N, a linked clone's on its base
// too), not a template's base (LvmThinPlugin volume_has_feature:
// snapshot => { current => 1 }).
var reCTSnapVolume = regexp.MustCompile(`^` + thinStorage + `:(base-\d+-disk-\d+/)?vm-\d+-disk-\d+$`)

// ctSnapshotCapable is LXC::Config has_feature('snapshot'): every volume
// of the CT (rootfs, mount points) supports it.
func ctSnapshotCapable(conf map[string]string) bool {
	for k, val := range conf {
		if k != "rootfs" && !reMPKey.MatchString(k) {
			continue
		}
		if vol, _, _ := strings.Cut(val, ","); !reCTSnapVolume.MatchString(vol) {
			return false
		}
	}
	return true
}

// ctSnapshotConf is AbstractConfig __snapshot_copy_config: the config
// without snapshots, snapstate, snaptime, vmstate, lock, digest,
// description and unusedN (parent is kept in snapshot.parent).
func ctSnapshotConf(conf map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range conf {
		switch {
		case k == "snapstate" || k == "snaptime" || k == "vmstate" || k == "lock" || k == "digest" || k == "description" || k == "parent":
		case reUnusedKey.MatchString(k):
		default:
			out[k] = v
		}
	}
	return out
}

// listCTSnapshots is GET .../lxc/{vmid}/snapshot (Snapshot.pm list,
// VM.Audit): each snapshot with its name, snaptime, description, parent
// and an unfinished one's snapstate, then "current" with the config's
// digest, whether the CT runs and its parent.
func (s *Server) listCTSnapshots(_ context.Context, rq *request) (any, error) {
	var out []map[string]any
	err := s.openGuest(kindLXC, rq, nil, func(v *vm) error {
		out = snapshotList(v, s.ctPIDLockedOK(v))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ctSnapshotDir is where the copy of a CT's layer for snapshot name is.
func (s *Server) ctSnapshotDir(vmid int, name string) string {
	return filepath.Join(s.vmDir(vmid), "snap-"+name)
}

// createCTSnapshot is POST .../lxc/{vmid}/snapshot (Snapshot.pm snapshot,
// VM.Snapshot): the reserved names are refused in the request, everything
// else in the vzsnapshot worker (AbstractConfig snapshot_create): a CT
// that does not exist fails the task. A stop of the task (stop_task's
// SIGTERM) while the volume is copied dies as the worker does in
// snapshot_create's eval: the CT thawed, the snapshot cleaned up.
func (s *Server) createCTSnapshot(_ context.Context, rq *request) (any, error) {
	vmid, name, desc := s.vmid(rq), rq.str("snapname"), rq.str("description")
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	if name == "current" || name == "vzdump" {
		return nil, fail("unable to use snapshot name '%s' (reserved name)", name)
	}
	return s.startStoppableTask(rq, "vzsnapshot", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		if err := s.ctSnapshotPrepare(ctx, t, vmid, name, desc); err != nil {
			return err
		}
		s.mu.Lock()
		hold := s.hooks.ctSnapshotPrepared
		s.mu.Unlock()
		if hold != nil {
			hold(vmid)
		}
		dst := s.ctSnapshotDir(vmid, name)
		thaw, err := s.ctSnapshotFreeze(ctx, t, vmid)
		if err == nil {
			err = copyDir(ctx, s.DiskDir(vmid), dst)
		}
		thaw()
		if err != nil {
			t.warn("snapshot create failed: starting cleanup")
			_ = os.RemoveAll(dst)
			s.ctSnapshotForget(context.WithoutCancel(ctx), vmid, name)
			if ctx.Err() != nil {
				return errInterrupted
			}
			return err
		}
		_, unlock, err := s.lockGuest(ctx, kindLXC, vmid, func(v *vm) error {
			if v.conf["lock"] != "snapshot" {
				return fail("missing snapshot lock")
			}
			sn := v.snaps[name]
			if sn == nil {
				return fail("snapshot '%s' does not exist", name)
			}
			if sn.state != "prepare" {
				return fail("wrong snapshot state")
			}
			sn.state = ""
			delete(v.conf, "lock")
			v.conf["parent"] = name
			return nil
		})
		if err != nil {
			return err
		}
		unlock()
		return nil
	}), nil
}

// ctSnapshotFreeze is snapshot_create's freeze for a CT: a CT that runs
// (LXC::Config __snapshot_check_freeze_needed: check_running) is frozen
// before its volume's snapshot (__snapshot_freeze: LXC freeze, then
// sync_container_namespace), and a failed freeze fails the snapshot. The
// thaw returned is snapshot_create's after the volumes' snapshots, due
// for a CT that ran whatever happened since (a failed freeze, a failed or
// cancelled copy among them): LXC thaw, whose failure is only a warning.
// The sync (syncfs of the CT's mounts) has no counterpart: the copy reads
// the volume through the host's page cache, which holds every write the
// CT made before it froze. Without a CTFreezer the volume is copied live.
func (s *Server) ctSnapshotFreeze(ctx context.Context, t *task, vmid int) (thaw func(), err error) {
	fr, ok := s.backendOf(vmid).(CTFreezer)
	if !ok || !s.ctRunning(vmid) {
		return func() {}, nil
	}
	thaw = func() {
		if err := fr.ThawContainer(context.WithoutCancel(ctx), vmid); err != nil {
			t.warn("%v", err)
		}
	}
	if err := fr.FreezeContainer(ctx, vmid); err != nil {
		return thaw, fmt.Errorf("command failed: %w", err)
	}
	s.mu.Lock()
	hook := s.hooks.ctSnapshotFrozen
	s.mu.Unlock()
	if hook != nil {
		hook(ctx, vmid)
	}
	return thaw, nil
}

// ctSnapshotPrepare is AbstractConfig __snapshot_prepare under the CT's
// config lock: a template refused, the lock checked, the name free, every
// volume able to snapshot; then "lock: snapshot" and the snapshot's
// section (the config's copy, snapstate "prepare") written. A snapshot
// whose parent has the new name loses its parent (a bogus cycle).
func (s *Server) ctSnapshotPrepare(ctx context.Context, t *task, vmid int, name, desc string) error {
	_, unlock, err := s.lockGuest(ctx, kindLXC, vmid, func(v *vm) error {
		if v.conf["template"] == "1" {
			return fail("you can't take a snapshot if it's a template")
		}
		if err := checkLock(v); err != nil {
			return err
		}
		if v.snaps[name] != nil {
			return fail("snapshot name '%s' already used", name)
		}
		if !ctSnapshotCapable(v.conf) {
			return fail("snapshot feature is not available")
		}
		for _, n := range sortedKeys(v.snaps) {
			if v.snaps[n].parent == name {
				t.warn("deleting parent '%s' reference from '%s' to avoid bogus snapshot cycle.", name, n)
				v.snaps[n].parent = ""
			}
		}
		v.conf["lock"] = "snapshot"
		v.snaps[name] = &snapshot{name: name, description: desc, snaptime: time.Now().Unix(), parent: v.conf["parent"],
			conf: ctSnapshotConf(v.conf), state: "prepare"}
		return nil
	})
	if err != nil {
		return err
	}
	unlock()
	return nil
}

// ctSnapshotForget is snapshot_create's cleanup (snapshot_delete with
// force): the snapshot's section and the config's lock go.
func (s *Server) ctSnapshotForget(ctx context.Context, vmid int, name string) {
	_, unlock, err := s.lockGuest(ctx, kindLXC, vmid, func(v *vm) error {
		delete(v.snaps, name)
		delete(v.conf, "lock")
		return nil
	})
	if err == nil {
		unlock()
	}
}

// migrationLockFile is pve-guest-common GuestHelpers guest_migration_lock's
// lock file.
func migrationLockFile(vmid int) string {
	return fmt.Sprintf("/var/lock/pve-manager/pve-migrate-%d", vmid)
}

// rollbackCT is POST .../lxc/{vmid}/snapshot/{snapname}/rollback
// (Snapshot.pm rollback, VM.Snapshot or VM.Snapshot.Rollback): nothing is
// checked in the request; the vzrollback worker takes the guest's
// migration lock (10 s) and runs AbstractConfig snapshot_rollback, then,
// with start, calls the start handler (Status.pm vm_start) as a method:
// no privilege check, "CT N already running" fails the rollback's task,
// and the start is a vzstart task of its own that the rollback's task
// does not wait for.
func (s *Server) rollbackCT(_ context.Context, rq *request) (any, error) {
	vmid, name, start := s.vmid(rq), rq.str("snapname"), rq.bool("start", false)
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	return s.startTask(rq, "vzrollback", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		s.mu.Lock()
		node := s.node
		if v := s.vms[vmid]; v != nil {
			node = s.vmNodeLocked(v)
		}
		s.mu.Unlock()
		unlock, err := s.flock(ctx, node, migrationLockFile(vmid), 10*time.Second, func() { t.logf("trying to acquire lock...") })
		if err != nil {
			return err
		}
		defer unlock()
		if err := s.ctRollback(ctx, t, vmid, name); err != nil {
			return err
		}
		if !start {
			return nil
		}
		if s.ctRunning(vmid) {
			return fail("CT %d already running", vmid)
		}
		s.startTask(rq, "vzstart", strconv.Itoa(vmid), s.ctStartWorker(vmid, false))
		return nil
	}), nil
}

// ctRollbackSnap is snapshot_rollback's check of the config in both of
// its steps: no template, the snapshot there and complete.
func ctRollbackSnap(v *vm, name string) (*snapshot, error) {
	if v.conf["template"] == "1" {
		return nil, fail("you can't rollback if vm is a template")
	}
	sn := v.snaps[name]
	if sn == nil {
		return nil, fail("snapshot '%s' does not exist", name)
	}
	if sn.state != "" {
		return nil, fail("unable to rollback to incomplete snapshot (snapstate = %s)", sn.state)
	}
	return sn, nil
}

// ctRollback is AbstractConfig snapshot_rollback for a CT: under the
// config lock the checks (ctRollbackSnap, the lock), a running CT
// stopped (LXC::Config __snapshot_rollback_vm_stop: vm_stop with kill)
// and "lock: rollback" written; the volume rolled back with no config
// lock held; then under the config lock again the rollback lock checked
// and the snapshot's config applied (__snapshot_apply_config: the
// current description and unusedN kept) with parent the snapshot.
func (s *Server) ctRollback(ctx context.Context, t *task, vmid int, name string) error {
	var wasRunning bool
	v, unlock, err := s.lockGuest(ctx, kindLXC, vmid, func(v *vm) error {
		if _, err := ctRollbackSnap(v, name); err != nil {
			return err
		}
		if err := checkLock(v); err != nil {
			return err
		}
		wasRunning = s.ctPIDLockedOK(v)
		return nil
	})
	if err != nil {
		return err
	}
	if wasRunning {
		if err := s.stopCT(ctx, v); err != nil {
			unlock()
			return err
		}
	}
	s.mu.Lock()
	v.conf["lock"] = "rollback"
	hold := s.hooks.ctRollbackLocked
	s.mu.Unlock()
	unlock()
	if hold != nil {
		hold(vmid)
	}
	disk := s.DiskDir(vmid)
	rerr := os.RemoveAll(disk)
	if rerr == nil {
		rerr = copyDir(ctx, s.ctSnapshotDir(vmid, name), disk)
	}
	if rerr != nil {
		return fmt.Errorf("rollback of the volume to '%s': %w", name, rerr)
	}
	_, unlock, err = s.lockGuest(ctx, kindLXC, vmid, func(v *vm) error {
		sn, err := ctRollbackSnap(v, name)
		if err != nil {
			return err
		}
		if v.conf["lock"] != "rollback" {
			return fail("got wrong lock")
		}
		conf := copyConf(sn.conf)
		for k, val := range v.conf {
			if k == "description" || reUnusedKey.MatchString(k) {
				conf[k] = val
			}
		}
		conf["parent"] = name
		v.conf = conf
		v.pending, v.pendingDel = nil, nil
		return nil
	})
	if err != nil {
		return err
	}
	unlock()
	t.logf("rolled back CT %d to snapshot '%s'", vmid, name)
	return nil
}

// HoldCTSnapshots makes every CT snapshot task stop once its prepare
// step wrote "lock: snapshot" (before the volume snapshot), and every CT
// rollback once it wrote "lock: rollback" (before the volume's rollback),
// sending the CT's id on held, until release is called (tests race other
// calls against them). A later call replaces the hold.
func (s *Server) HoldCTSnapshots() (held <-chan int, release func()) {
	ch := make(chan int, 16)
	gate := make(chan struct{})
	var once sync.Once
	hold := func(vmid int) {
		select {
		case ch <- vmid:
		default:
		}
		<-gate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hooks.ctSnapshotPrepared, s.hooks.ctRollbackLocked = hold, hold
	return ch, func() { once.Do(func() { close(gate) }) }
}

// snapshotSection is a snapshot's section of the config as
// load_snapshot_config returns it: its config, snaptime, the description
// given, its parent and, while unfinished, its snapstate.
func snapshotSection(sn *snapshot) map[string]string {
	out := copyConf(sn.conf)
	out["snaptime"] = strconv.FormatInt(sn.snaptime, 10)
	for k, v := range map[string]string{"description": sn.description, "parent": sn.parent, "snapstate": sn.state} {
		if v != "" {
			out[k] = v
		}
	}
	return out
}
