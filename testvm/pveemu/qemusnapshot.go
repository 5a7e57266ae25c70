package pveemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func (s *Server) listSnapshots(_ context.Context, rq *request) (any, error) {
	var out []map[string]any
	err := s.openVM(rq, nil, func(v *vm) error {
		out = snapshotList(v, v.running)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// snapshotList is a guest's snapshot list (qemu-server API2/Qemu.pm
// snapshot_list, pve-container API2/LXC/Snapshot.pm list): each
// snapshot's name, description, snaptime, parent when set and snapstate
// while unfinished, then "current" with the config's digest, whether the
// guest runs and its parent.
func snapshotList(v *vm, running bool) []map[string]any {
	out := []map[string]any{}
	for _, n := range sortedKeys(v.snaps) {
		sn := v.snaps[n]
		e := map[string]any{"name": sn.name, "description": sn.description, "snaptime": sn.snaptime}
		if sn.parent != "" {
			e["parent"] = sn.parent
		}
		if sn.state != "" {
			e["snapstate"] = sn.state
		}
		out = append(out, e)
	}
	cur := map[string]any{"name": "current", "digest": confDigest(v.conf), "description": "You are here!", "running": boolInt(running)}
	if p := v.conf["parent"]; p != "" {
		cur["parent"] = p
	}
	return append(out, cur)
}

func (s *Server) createSnapshot(ctx context.Context, rq *request) (any, error) {
	vmid, name, desc := s.vmid(rq), rq.str("snapname"), rq.str("description")
	params := func(rq *request) error {
		if name == "current" {
			return fail("invalid snapshot name 'current'")
		}
		if rq.bool("vmstate", false) {
			return fail("snapshot feature is not available")
		}
		return nil
	}
	if err := s.openVM(rq, params, vmExists); err != nil {
		return nil, err
	}
	return s.startTask(rq, "qmsnapshot", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		v, unlock, err := s.lockVM(ctx, vmid, func(v *vm) error {
			if err := checkLock(v); err != nil {
				return err
			}
			if v.conf["template"] == "1" {
				return fail("you can't take a snapshot if it's a template")
			}
			if v.snaps[name] != nil {
				return fail("snapshot name '%s' already used", name)
			}
			if !snapshotCapable(v.conf) {
				return fail("snapshot feature is not available")
			}
			v.conf["lock"] = "snapshot"
			return nil
		})
		if err != nil {
			return err
		}
		unlock()
		thaw, ferr := s.snapshotFreeze(ctx, t, v)
		dst := filepath.Join(s.vmDir(vmid), "snap-"+name)
		cerr := ferr
		if cerr == nil {
			cerr = copyDir(ctx, s.DiskDir(vmid), dst)
		}
		thaw()
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(v.conf, "lock")
		if cerr != nil {
			_ = os.RemoveAll(dst)
			return fmt.Errorf("snapshot '%s': %w", name, cerr)
		}
		snapConf := copyConf(v.conf)
		delete(snapConf, "parent")
		v.snaps[name] = &snapshot{name: name, description: desc, snaptime: time.Now().Unix(), parent: v.conf["parent"], conf: snapConf}
		v.conf["parent"] = name
		return nil
	}), nil
}

func (s *Server) rollbackSnapshot(ctx context.Context, rq *request) (any, error) {
	vmid, name := s.vmid(rq), rq.str("snapname")
	start := rq.bool("start", false)
	// The start runs inside the worker, so the API checks VM.PowerMgmt up
	// front (qemu-server API2/Qemu.pm rollback).
	params := func(rq *request) error {
		if !start {
			return nil
		}
		return s.checkPrivs(rq.authid, fmt.Sprintf("/vms/%d", vmid), []string{"VM.PowerMgmt"}, false)
	}
	err := s.openVM(rq, params, func(v *vm) error {
		if v.snaps[name] == nil {
			return fail("snapshot '%s' does not exist", name)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s.startTask(rq, "qmrollback", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		s.mu.Lock()
		v, err := s.loadVM(vmid)
		if err == nil && v.conf["template"] == "1" {
			err = fail("you can't rollback if vm is a template")
		}
		if err == nil && v.snaps[name] == nil {
			err = fail("snapshot '%s' does not exist", name)
		}
		if err == nil {
			err = checkLock(v)
		}
		wasRunning := err == nil && v.running
		s.mu.Unlock()
		if err != nil {
			return err
		}
		if wasRunning {
			if err := s.doStop(ctx, vmid, false); err != nil {
				return err
			}
		}
		s.mu.Lock()
		v.conf["lock"] = "rollback"
		s.mu.Unlock()
		disk := s.DiskDir(vmid)
		rerr := os.RemoveAll(disk)
		if rerr == nil {
			rerr = copyDir(ctx, filepath.Join(s.vmDir(vmid), "snap-"+name), disk)
		}
		s.mu.Lock()
		if rerr != nil {
			s.mu.Unlock()
			return fmt.Errorf("rollback failed: %w", rerr)
		}
		conf := copyConf(v.snaps[name].conf)
		conf["parent"] = name
		v.conf = conf
		s.mu.Unlock()
		if start {
			return s.doStart(ctx, t, vmid, false)
		}
		return nil
	}), nil
}

func (s *Server) deleteSnapshot(ctx context.Context, rq *request) (any, error) {
	vmid, name := s.vmid(rq), rq.str("snapname")
	force := rq.bool("force", false)
	if err := s.openVM(rq, nil, vmExists); err != nil {
		return nil, err
	}
	return s.startTask(rq, "qmdelsnapshot", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		s.mu.Lock()
		v, err := s.loadVM(vmid)
		if err == nil && v.snaps[name] == nil {
			err = fail("snapshot '%s' does not exist", name)
		}
		if err == nil && !force {
			err = checkLock(v)
		}
		if err == nil {
			v.conf["lock"] = "snapshot-delete"
		}
		s.mu.Unlock()
		if err != nil {
			return err
		}
		rerr := os.RemoveAll(filepath.Join(s.vmDir(vmid), "snap-"+name))
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(v.conf, "lock")
		if rerr != nil {
			return fmt.Errorf("delete snapshot: %w", rerr)
		}
		parent := v.snaps[name].parent
		for _, other := range v.snaps {
			if other.parent == name {
				other.parent = parent
			}
		}
		if v.conf["parent"] == name {
			if parent != "" {
				v.conf["parent"] = parent
			} else {
				delete(v.conf, "parent")
			}
		}
		delete(v.snaps, name)
		return nil
	}), nil
}

// snapshotFreeze puts the agent of a running VM with fsfreeze on in the
// frozen state for a snapshot (qemu-server QemuConfig
// __snapshot_check_freeze_needed: running, no vmstate, and Agent
// guest_fs_freeze_applicable: the agent enabled with freeze-fs, default
// on; then __snapshot_freeze), without freezing any file system: the
// backend's AgentFreezer answers as qemu-ga does while frozen. The
// returned thaw ends the state (__snapshot_freeze's thaw after the
// volumes' snapshots). The hook snapshotFrozen, when set, runs while
// frozen (tests hold a snapshot open with it).
func (s *Server) snapshotFreeze(ctx context.Context, t *task, v *vm) (thaw func(), err error) {
	s.mu.Lock()
	need := v.running && agentEnabled(v.conf["agent"]) && freezeFS(v.conf["agent"])
	be := s.backendOfLocked(v)
	hook := s.snapshotFrozen
	s.mu.Unlock()
	fr, ok := be.(AgentFreezer)
	if !need || !ok {
		return func() {}, nil
	}
	if err := fr.SetAgentFrozen(v.vmid, true); err != nil {
		return func() {}, fmt.Errorf("guest-fsfreeze-freeze: %w", err)
	}
	t.logf("issuing guest fs freeze")
	if hook != nil {
		hook(ctx, v.vmid)
	}
	return func() {
		_ = fr.SetAgentFrozen(v.vmid, false)
		t.logf("issuing guest fs thaw")
	}, nil
}

// freezeFS is the agent option freeze-fs (aliases freeze-fs-on-backup,
// guest-fsfreeze), default on (qemu-server Agent.pm should_fs_freeze).
func freezeFS(agent string) bool {
	for _, part := range strings.Split(agent, ",") {
		k, val, ok := strings.Cut(part, "=")
		if ok && (k == "freeze-fs" || k == "freeze-fs-on-backup" || k == "guest-fsfreeze") {
			return parseBoolText(val) == "1"
		}
	}
	return true
}
