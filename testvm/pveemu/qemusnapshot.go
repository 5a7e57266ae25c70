package pveemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

func (s *Server) listSnapshots(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.loadVM(s.vmid(rq))
	if err != nil {
		return nil, err
	}
	out := []map[string]any{}
	for _, n := range sortedKeys(v.snaps) {
		sn := v.snaps[n]
		e := map[string]any{"name": sn.name, "description": sn.description, "snaptime": sn.snaptime}
		if sn.parent != "" {
			e["parent"] = sn.parent
		}
		out = append(out, e)
	}
	cur := map[string]any{"name": "current", "digest": confDigest(v.conf), "description": "You are here!", "running": boolInt(v.running)}
	if p := v.conf["parent"]; p != "" {
		cur["parent"] = p
	}
	return append(out, cur), nil
}

func (s *Server) createSnapshot(ctx context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid, name, desc := s.vmid(rq), rq.str("snapname"), rq.str("description")
	if name == "current" {
		return nil, fail("invalid snapshot name 'current'")
	}
	if rq.bool("vmstate", false) {
		return nil, fail("snapshot feature is not available")
	}
	s.mu.Lock()
	_, err := s.loadVM(vmid)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.startTask(rq.authid, "qmsnapshot", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		unlock, err := s.vmLock(ctx, vmid, 10*time.Second)
		if err != nil {
			return err
		}
		s.mu.Lock()
		v, err := s.loadVM(vmid)
		if err == nil {
			err = checkLock(v)
		}
		if err == nil && v.conf["template"] == "1" {
			err = fail("you can't take a snapshot if it's a template")
		}
		if err == nil && v.snaps[name] != nil {
			err = fail("snapshot name '%s' already used", name)
		}
		if err == nil {
			v.conf["lock"] = "snapshot"
		}
		s.mu.Unlock()
		unlock()
		if err != nil {
			return err
		}
		dst := filepath.Join(s.vmDir(vmid), "snap-"+name)
		cerr := copyDir(ctx, s.DiskDir(vmid), dst)
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
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid, name := s.vmid(rq), rq.str("snapname")
	start := rq.bool("start", false)
	// The start runs inside the worker, so the API checks VM.PowerMgmt up
	// front (qemu-server API2/Qemu.pm rollback).
	if start {
		if err := s.checkPrivs(rq.authid, fmt.Sprintf("/vms/%d", vmid), []string{"VM.PowerMgmt"}, false); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	v, err := s.loadVM(vmid)
	if err == nil && v.snaps[name] == nil {
		err = fail("snapshot '%s' does not exist", name)
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.startTask(rq.authid, "qmrollback", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
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
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	vmid, name := s.vmid(rq), rq.str("snapname")
	force := rq.bool("force", false)
	s.mu.Lock()
	_, err := s.loadVM(vmid)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.startTask(rq.authid, "qmdelsnapshot", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
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
