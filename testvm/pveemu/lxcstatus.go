package pveemu

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// ctStatusCurrent is GET .../lxc/{vmid}/status/current
// (API2/LXC/Status.pm vm_status): vmstatus of the CT with its HA state.
func (s *Server) ctStatusCurrent(_ context.Context, rq *request) (any, error) {
	var st map[string]any
	err := s.openGuest(kindLXC, rq, nil, func(v *vm) error {
		st = s.ctStatusLocked(v)
		st["ha"] = map[string]any{"managed": 0}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// ctRunning is check_running: the CT runs (a CT that does not exist does
// not).
func (s *Server) ctRunning(vmid int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.vms[vmid]
	if v == nil || v.kind != kindLXC {
		return false
	}
	_, ok := s.ctPIDLocked(v)
	return ok
}

// ctPowerOpening is what the CT power calls check before their worker:
// the node, skiplock root's alone, and the CT running (stop, shutdown:
// "CT N not running") or not (start: "CT N already running").
func (s *Server) ctPowerOpening(rq *request, wantRunning bool) error {
	if err := s.checkNode(rq); err != nil {
		return err
	}
	if err := checkSkiplock(rq); err != nil {
		return err
	}
	vmid := s.vmid(rq)
	switch running := s.ctRunning(vmid); {
	case running && !wantRunning:
		return fail("CT %d already running", vmid)
	case !running && wantRunning:
		return fail("CT %d not running", vmid)
	}
	return nil
}

// ctStart is POST .../status/start (Status.pm vm_start): skiplock is
// root's, a running CT is refused at once ("CT 101 already running"),
// and a vzstart worker does the rest under the config lock: the config
// loaded (a missing CT fails the task), a template refused, the lock
// checked (unless skiplock or "mounted"), then PVE::LXC::vm_start.
func (s *Server) ctStart(_ context.Context, rq *request) (any, error) {
	vmid, skiplock := s.vmid(rq), rq.bool("skiplock", false)
	if err := s.ctPowerOpening(rq, false); err != nil {
		return nil, err
	}
	return s.startTask(rq, "vzstart", strconv.Itoa(vmid), s.ctStartWorker(vmid, skiplock)), nil
}

// ctStartWorker is vm_start's vzstart worker (a rollback with start runs
// one too, lxcsnapshot.go).
func (s *Server) ctStartWorker(vmid int, skiplock bool) func(ctx context.Context, t *task) error {
	return func(ctx context.Context, t *task) error {
		var spec CTSpec
		v, unlock, err := s.lockGuest(ctx, kindLXC, vmid, func(v *vm) error {
			if v.conf["template"] == "1" {
				return fail("you can't start a CT if it's a template")
			}
			if !skiplock && v.conf["lock"] != "mounted" {
				if err := checkLock(v); err != nil {
					return err
				}
			}
			applyCTPendingLocked(s, v)
			var err error
			spec, err = s.ctSpecLocked(v)
			return err
		})
		if err != nil {
			return err
		}
		defer unlock()
		return s.runCT(ctx, t, v, spec)
	}
}

// runCT is PVE::LXC::vm_start once the config is checked: the pre-start
// hook's add_dhcp_mapping for net0 (failing while an SDN apply has the
// zone's dnsmasq stopped, as on a node: the hook dies, and with it
// "systemctl start pve-container@<vmid>"), then the backend's start.
func (s *Server) runCT(ctx context.Context, t *task, v *vm, spec CTSpec) error {
	startErr := fmt.Errorf("command 'systemctl start pve-container@%d' failed: exit code 1", spec.VMID)
	if spec.Net != nil {
		if zone, _, failed := s.addDHCPMapping(spec.VMID, spec.Net.Bridge, spec.Net.MAC); failed {
			t.logf("lxc pre-start hook: command 'systemctl reload dnsmasq@%s' failed: exit code 1", zone)
			return startErr
		}
	}
	cb, ok := s.backendOf(spec.VMID).(ContainerBackend)
	if !ok {
		return errors.New("pveemu: the node's backend runs no containers")
	}
	if _, err := cb.StartContainer(ctx, spec); err != nil {
		t.logf("%v", err) // the container's start log, as print_ct_stderr_log shows it
		return startErr
	}
	s.mu.Lock()
	v.running, v.started = true, time.Now()
	s.mu.Unlock()
	return nil
}

// stopCT kills a CT (PVE::LXC::vm_stop with kill: lxc-stop --kill) and
// marks it stopped.
func (s *Server) stopCT(ctx context.Context, v *vm) error {
	cb, ok := s.backendOf(v.vmid).(ContainerBackend)
	if !ok {
		return errors.New("pveemu: the node's backend runs no containers")
	}
	if err := cb.StopContainer(ctx, v.vmid); err != nil {
		return fmt.Errorf("container did not stop: %w", err)
	}
	s.mu.Lock()
	v.running = false
	s.mu.Unlock()
	return nil
}

// ctStop is POST .../status/stop (Status.pm vm_stop): skiplock is root's,
// a CT that does not run is refused at once ("CT 101 not running": unlike
// qemu-server's stop, which succeeds), then a vzstop worker under the
// config lock checks the lock (unless skiplock or "mounted") and kills
// the CT. overrule-shutdown's abort of running vzshutdown tasks is not
// emulated.
func (s *Server) ctStop(_ context.Context, rq *request) (any, error) {
	vmid, skiplock := s.vmid(rq), rq.bool("skiplock", false)
	if err := s.ctPowerOpening(rq, true); err != nil {
		return nil, err
	}
	return s.startTask(rq, "vzstop", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		v, unlock, err := s.lockGuest(ctx, kindLXC, vmid, func(v *vm) error {
			if !skiplock && v.conf["lock"] != "mounted" {
				return checkLock(v)
			}
			return nil
		})
		if err != nil {
			return err
		}
		defer unlock()
		return s.stopCT(ctx, v)
	}), nil
}

// ctShutdown is POST .../status/shutdown (Status.pm vm_shutdown): a CT
// that does not run is refused at once, then a vzshutdown worker under
// the config lock checks the lock (no skiplock here) and asks the init
// to power off (vm_stop without kill: lxc-stop --timeout, default 60 s,
// --nokill unless forceStop), "container did not stop" when it did not.
func (s *Server) ctShutdown(_ context.Context, rq *request) (any, error) {
	vmid := s.vmid(rq)
	timeout := time.Duration(rq.int("timeout", 60)) * time.Second
	force := rq.bool("forceStop", false)
	if err := s.ctPowerOpening(rq, true); err != nil {
		return nil, err
	}
	return s.startTask(rq, "vzshutdown", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		v, unlock, err := s.lockGuest(ctx, kindLXC, vmid, checkLock)
		if err != nil {
			return err
		}
		defer unlock()
		cb, ok := s.backendOf(vmid).(ContainerBackend)
		if !ok {
			return errors.New("pveemu: the node's backend runs no containers")
		}
		if err := cb.ShutdownContainer(ctx, vmid, timeout, force); err != nil {
			t.logf("%v", err)
			return fmt.Errorf("container did not stop")
		}
		s.mu.Lock()
		v.running = false
		s.mu.Unlock()
		return nil
	}), nil
}
