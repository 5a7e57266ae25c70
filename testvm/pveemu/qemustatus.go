package pveemu

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

func (s *Server) vmStatusLocked(v *vm) map[string]any {
	st := map[string]any{
		"vmid": v.vmid, "status": "stopped", "qmpstatus": "stopped", "name": v.conf["name"],
		"cpus": atoiDef(v.conf["cores"], 1), "maxmem": atoiDef(v.conf["memory"], 512) * 1024 * 1024,
		"maxdisk": 8 << 30, "uptime": 0, "mem": 0, "cpu": 0, "disk": 0, "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0,
	}
	if v.running {
		st["status"], st["qmpstatus"] = "running", "running"
		st["uptime"] = int(time.Since(v.started).Seconds())
		st["pid"] = 100000 + v.vmid
	}
	if v.conf["template"] == "1" {
		st["template"] = 1
	}
	if l := v.conf["lock"]; l != "" {
		st["lock"] = l
	}
	if agentEnabled(v.conf["agent"]) {
		st["agent"] = 1
	}
	if t := v.conf["tags"]; t != "" {
		st["tags"] = t
	}
	return st
}

func atoiDef(s string, def int) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return def
	}
	return n
}

// agentEnabled is the agent property string's enabled (Agent.pm
// parse_guest_agent): the default key, given bare or as enabled=, at any
// place in the list (pve-common JSONSchema.pm parse_property_string).
func agentEnabled(v string) bool {
	for _, part := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(part, "=")
		switch {
		case !ok && part != "":
			return parseBoolText(part) == "1"
		case k == "enabled":
			return parseBoolText(val) == "1"
		}
	}
	return false
}

func (s *Server) statusCurrent(_ context.Context, rq *request) (any, error) {
	var st map[string]any
	err := s.openVM(rq, nil, func(v *vm) error {
		st = s.vmStatusLocked(v)
		st["ha"] = map[string]any{"managed": 0}
		if v.running {
			// vmstatus with full: query-version and query-machines.
			st["running-qemu"] = QEMUVersion
			st["running-machine"] = runningMachine(v.conf)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// vmSpec derives what the backend needs to start the guest (with its
// agent only when the config enables it: config_to_command). Each NIC's
// pve-bridge hook first maps its MAC's IPAM address for the zone's DHCP
// (Vnets.pm add_dhcp_mapping, allocating one when the MAC has none); the
// backend starts net0 only, with its address.
func (s *Server) vmSpecLocked(v *vm) (VMSpec, error) {
	spec := VMSpec{VMID: v.vmid, Disk: s.DiskDir(v.vmid), MemoryMiB: atoiDef(v.conf["memory"], 512), CPUs: vmCPUs(v.conf),
		NoAgent: !agentEnabled(v.conf["agent"])}
	for _, k := range sortedKeys(v.conf) {
		if !reNetKey.MatchString(k) {
			continue
		}
		mac, bridge := parseNet(v.conf[k])
		ip, err := s.dhcpMappingIPLocked(bridge, mac, v.vmid, v.conf["name"])
		if err != nil {
			return spec, fmt.Errorf("%s: %w", k, err)
		}
		if k != "net0" {
			continue
		}
		spec.VNet = bridge
		if mac != "" {
			hw, err := net.ParseMAC(mac)
			if err != nil {
				return spec, fmt.Errorf("net0: %w", err)
			}
			spec.MAC = hw
			spec.IP = ip
		}
		if bridge != "" && !s.bridgeOnLocked(s.vmNodeLocked(v), bridge) {
			return spec, fmt.Errorf("bridge '%s' does not exist", bridge)
		}
	}
	return spec, nil
}

func (s *Server) doStart(ctx context.Context, t *task, vmid int, skiplock bool) error {
	var spec VMSpec
	var disks []coldDisk
	var conf map[string]string
	_, unlock, err := s.lockVM(ctx, vmid, func(v *vm) error {
		if v.conf["template"] == "1" {
			return fail("you can't start a vm if it's a template")
		}
		if !skiplock {
			if err := checkLock(v); err != nil {
				return err
			}
		}
		if v.running {
			return fail("VM %d already running", vmid)
		}
		// vm_start_nolock: pending changes are applied before the start.
		applyPendingLocked(s, v)
		conf = copyConf(v.conf)
		disks = s.coldDisks(v.conf)
		var err error
		spec, err = s.vmSpecLocked(v)
		return err
	})
	if err != nil {
		return err
	}
	defer unlock()
	// vm_start_nolock: apply_cloudinit_config reads the cicustom snippets
	if err := s.checkCicustom(vmid, conf); err != nil {
		return err
	}
	if err := s.dhcpMapping(t, vmid, spec); err != nil {
		return err
	}
	be := s.backendOf(vmid)
	if err := be.StartVM(ctx, spec); err != nil {
		return fmt.Errorf("start failed: %w", err)
	}
	if err := attachCold(ctx, be, vmid, disks); err != nil {
		_ = be.StopVM(context.WithoutCancel(ctx), vmid)
		return fmt.Errorf("start failed: %w", err)
	}
	s.mu.Lock()
	if v := s.vms[vmid]; v != nil {
		v.running, v.started, v.unseen = true, time.Now(), nil
	}
	s.mu.Unlock()
	return nil
}

// attachCold plugs the dir storage's disks of a VM being started: QEMU
// opens every drive of its command line at the start, so a disk set while
// the VM was stopped, or applied from pending, is there from the start.
func attachCold(ctx context.Context, be Backend, vmid int, disks []coldDisk) error {
	if len(disks) == 0 {
		return nil
	}
	bb, ok := be.(BlockBackend)
	if !ok {
		return fmt.Errorf("the emulator's backend cannot attach disks (%s)", disks[0].slot)
	}
	for _, d := range disks {
		if err := bb.AttachDisk(ctx, vmid, d.slot, d.image, d.byID); err != nil {
			return fmt.Errorf("%s: %w", d.slot, err)
		}
	}
	return nil
}

func (s *Server) doStop(ctx context.Context, vmid int, skiplock bool) error {
	running := false
	_, unlock, err := s.lockVM(ctx, vmid, func(v *vm) error {
		if !skiplock {
			if err := checkLock(v); err != nil {
				return err
			}
		}
		running = v.running
		return nil
	})
	if err != nil {
		return err
	}
	defer unlock()
	if !running {
		return nil
	}
	if err := s.backendOf(vmid).StopVM(ctx, vmid); err != nil {
		return fmt.Errorf("stop failed: %w", err)
	}
	s.mu.Lock()
	if v := s.vms[vmid]; v != nil {
		v.running, v.unseen = false, nil
	}
	s.mu.Unlock()
	return nil
}

func (s *Server) vmAction(typ string) handlerFunc {
	return func(ctx context.Context, rq *request) (any, error) {
		vmid := s.vmid(rq)
		skiplock := rq.bool("skiplock", false)
		running := false
		onVM := func(v *vm) error { running = v.running; return nil }
		if typ == "qmstop" {
			// vm_stop forks the worker at once: PVE::QemuServer::vm_stop
			// loads the config (a missing VM fails the task) and returns
			// quietly when the VM is not running (task OK).
			onVM = nil
		}
		if err := s.openVM(rq, checkSkiplock, onVM); err != nil {
			return nil, err
		}
		switch typ {
		case "qmstart":
			return s.startTask(rq, typ, strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
				return s.doStart(ctx, t, vmid, skiplock)
			}), nil
		case "qmstop":
			return s.startTask(rq, typ, strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
				return s.doStop(ctx, vmid, skiplock)
			}), nil
		default: // qmshutdown
			if !running {
				return nil, fail("VM %d not running", vmid)
			}
			return s.startTask(rq, typ, strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
				return s.doStop(ctx, vmid, skiplock)
			}), nil
		}
	}
}

// vmCPUs is the CPU time a VM's guest can use: its vCPU threads
// (qemu-server: sockets x cores, or vcpus when set and smaller), at most
// cpulimit when that is set (vm_start_nolock's CPUQuota).
func vmCPUs(conf map[string]string) float64 {
	n := atoiDef(conf["sockets"], 1) * atoiDef(conf["cores"], 1)
	if v := atoiDef(conf["vcpus"], 0); v > 0 && v < n {
		n = v
	}
	cpus := float64(n)
	if l, err := strconv.ParseFloat(conf["cpulimit"], 64); err == nil && l > 0 && l < cpus {
		cpus = l
	}
	return cpus
}

// dhcpMapping is what qemu-server's pve-bridge hook does for the VM's NIC
// before QEMU starts: pve-network's add_dhcp_mapping writes the MAC's
// address to the zone's ethers file, reloads dnsmasq@<zone> when that
// changed it (a first start) and updates the lease over D-Bus on every
// start, with no error handling (Dnsmasq.pm add_ip_mapping,
// systemctl_service, update_lease). While an SDN apply has the node's
// dnsmasqs stopped either fails, the hook dies and QEMU does not start;
// the mapping is written all the same.
func (s *Server) dhcpMapping(t *task, vmid int, spec VMSpec) error {
	zone, first, failed := s.addDHCPMapping(vmid, spec.VNet, spec.MAC)
	if !failed {
		return nil
	}
	if first {
		t.logf("command 'systemctl reload dnsmasq@%s' failed: exit code 1", zone)
	} else {
		t.logf("org.freedesktop.DBus.Error.ServiceUnknown: The name uk.org.thekelleys.dnsmasq.%s was not provided by any .service files", zone)
	}
	t.logf("kvm: -netdev type=tap,id=net0,ifname=tap%di0,script=/usr/libexec/qemu-server/pve-bridge,downscript=/usr/libexec/qemu-server/pve-bridgedown: network script /usr/libexec/qemu-server/pve-bridge failed with status 256", vmid)
	return fmt.Errorf("start failed: QEMU exited with code 1")
}

// addDHCPMapping is pve-network's add_dhcp_mapping for a guest NIC (the
// MAC on vnet) on the guest's node: the mapping is recorded (written to
// the zone's ethers file) whatever happens; failed is set when the zone's
// dnsmasq is stopped by an SDN apply, so the reload a first mapping needs
// (first) or the lease update over D-Bus fails. Nothing happens for a
// vnet whose zone has no DHCP with the pve IPAM.
func (s *Server) addDHCPMapping(vmid int, vnet string, mac net.HardwareAddr) (zone string, first, failed bool) {
	if vnet == "" || len(mac) == 0 {
		return "", false, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	vn := s.sdn.running.vnets[vnet]
	if vn == nil {
		return "", false, false
	}
	zone = vn["zone"]
	if z := s.sdn.running.zones[zone]; z == nil || z["dhcp"] == "" || z["ipam"] == "" {
		return "", false, false
	}
	v := s.vms[vmid]
	if v == nil {
		return "", false, false
	}
	n := s.members[s.vmNodeLocked(v)]
	key := vnet + " " + mac.String()
	first = !n.dhcpMapped[key]
	if n.dhcpMapped == nil {
		n.dhcpMapped = map[string]bool{}
	}
	n.dhcpMapped[key] = true
	return zone, first, n.dhcpStopped
}
