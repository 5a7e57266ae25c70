package pveemu

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Containers (pve-container): a CT is a vm of kind kindLXC in the one
// VMID space, with its config in nodes/<node>/lxc/<vmid>.conf, its own
// config lock (/run/lock/lxc/pve-config-<vmid>.lock) and the handlers of
// lxc.go, lxcclone.go, lxcconfig.go and lxcstatus.go. Its root volume is
// a directory pair: the template's root (vm.rootBase, used in place and
// never written: the base volume a linked clone shares) and the CT's own
// disk directory (DiskDir), which the backend overlays on it.

// ctDefaultCPUs is what vmstatus reports as a CT's cpus when neither cores
// nor cpulimit is set: the node's CPU count (the emulated node has 2).
const ctDefaultCPUs = 2

// reCTVolume matches a CT volume on the thin pool: a template's base
// (local-lvm:base-9000-disk-0), a linked clone's
// (local-lvm:base-9000-disk-0/vm-101-disk-0) or a full one
// (local-lvm:vm-101-disk-0), with its options.
var reCTVolume = regexp.MustCompile(`^([^:,]+):(?:base-\d+-disk-\d+/)?(?:vm|base)-\d+-(disk-\d+)(,.*)?$`)

// lxcNet is a CT's net[n] parsed (pve-container LXC/Config.pm
// parse_lxc_network).
type lxcNet map[string]string

// parseLXCNet reads "name=eth0,bridge=vnet1,ip=dhcp": every part is
// key=value (the format has no default key).
func parseLXCNet(val string) lxcNet {
	n := lxcNet{}
	for _, part := range strings.Split(val, ",") {
		if k, v, ok := strings.Cut(part, "="); ok {
			n[k] = v
		}
	}
	return n
}

// String is print_lxc_network (pve-common JSONSchema
// print_property_string): the required key (name) first, then the others
// sorted.
func (n lxcNet) String() string {
	keys := make([]string, 0, len(n))
	for k := range n {
		if k != "name" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var parts []string
	if name, ok := n["name"]; ok {
		parts = append(parts, "name="+name)
	}
	for _, k := range keys {
		parts = append(parts, k+"="+n[k])
	}
	return strings.Join(parts, ",")
}

// normalizeLXCNet is a net[n] as pve-container stores it once applied:
// parse_lxc_network sets type=veth and a random MAC when none is given,
// print_lxc_network prints it.
func normalizeLXCNet(val string) string {
	n := parseLXCNet(val)
	n["type"] = "veth"
	if n["hwaddr"] == "" {
		n["hwaddr"] = randomMAC()
	}
	return n.String()
}

// lxcNetMAC is the MAC and bridge of a CT's net[n] (for the IPAM).
func lxcNetMAC(val string) (mac, bridge string) {
	n := parseLXCNet(val)
	return n["hwaddr"], n["bridge"]
}

// AddCTTemplate registers a stopped unprivileged CT template whose root
// is rootfs: a root file system owned by the unprivileged range
// (testvm.CTRootfs), used in place, read only, as the template's base
// volume. conf holds extra config keys (e.g. "net0",
// "name=eth0,bridge=vnet1,ip=dhcp"); arch, ostype, hostname, memory, swap,
// cores, rootfs, unprivileged=1 and template=1 are set unless given. A
// net[n] without hwaddr gets one.
func (s *Server) AddCTTemplate(vmid int, hostname, rootfs string, conf map[string]string) error {
	if err := namedFormats["pve-vmid"](strconv.Itoa(vmid)); err != nil {
		return fmt.Errorf("pveemu: add CT template: vmid %d: %s", vmid, strings.TrimSpace(err.Error()))
	}
	if st, err := os.Stat(rootfs); err != nil || !st.IsDir() {
		return fmt.Errorf("pveemu: add CT template: root %s is not a directory (%v)", rootfs, err)
	}
	c := map[string]string{"arch": "amd64", "ostype": "debian", "hostname": hostname, "memory": "512", "swap": "512",
		"cores": "1", "rootfs": fmt.Sprintf("local-lvm:base-%d-disk-0,size=8G", vmid), "unprivileged": "1", "template": "1"}
	for k, v := range conf {
		if reNetKey.MatchString(k) {
			v = normalizeLXCNet(v)
		}
		c[k] = v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.vmidUnusedLocked(vmid); err != nil {
		return fmt.Errorf("pveemu: add CT template: %w", err)
	}
	s.vms[vmid] = &vm{vmid: vmid, kind: kindLXC, conf: c, rootBase: rootfs, snaps: map[string]*snapshot{}}
	return nil
}

// ctPIDLocked is the CT's init pid while it runs: started by the emulator
// and still running by its backend's word (a CT whose init powered off is
// stopped, as check_running finds it through lxc's command socket).
func (s *Server) ctPIDLocked(v *vm) (int, bool) {
	if !v.running {
		return 0, false
	}
	cb, ok := s.backendOfLocked(v).(ContainerBackend)
	if !ok {
		return 0, false
	}
	return cb.ContainerPID(v.vmid)
}

// ctStatusLocked is pve-container's vmstatus for one CT (LXC.pm): the
// name is the hostname or CT<vmid>, cpus is cores, else cpulimit, else
// the node's CPUs, maxdisk the rootfs's size (4 GiB without one), maxmem
// and maxswap from memory (512) and swap (0); a running CT has its
// init's pid and uptime. Usage figures are 0: the emulator measures
// nothing.
func (s *Server) ctStatusLocked(v *vm) map[string]any {
	c := v.conf
	name := c["hostname"]
	if name == "" {
		name = "CT" + strconv.Itoa(v.vmid)
	}
	name = strings.Join(strings.Fields(name), "")
	var cpus any = ctDefaultCPUs
	if n := atoiDef(c["cores"], 0); n > 0 {
		cpus = n
	} else if f, err := strconv.ParseFloat(c["cpulimit"], 64); err == nil && f > 0 {
		cpus = f
	}
	maxdisk := int64(4 << 30)
	if m := reSizeOpt.FindStringSubmatch(c["rootfs"]); m != nil {
		if b, err := sizeBytes(m[2], m[3]); err == nil {
			maxdisk = b
		}
	}
	st := map[string]any{
		"vmid": v.vmid, "type": "lxc", "status": "stopped", "name": name, "cpus": cpus,
		"maxmem": atoiDef(c["memory"], 512) << 20, "maxswap": atoiDef(c["swap"], 0) << 20, "maxdisk": maxdisk,
		"disk": 0, "mem": 0, "swap": 0, "uptime": 0, "cpu": 0, "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0,
	}
	if pid, ok := s.ctPIDLocked(v); ok {
		st["status"], st["pid"] = "running", pid
		st["uptime"] = int(time.Since(v.started).Seconds())
	}
	if t := c["tags"]; t != "" {
		st["tags"] = t
	}
	if c["template"] == "1" {
		st["template"] = 1
	}
	if l := c["lock"]; l != "" {
		st["lock"] = l
	}
	return st
}

// guestStatusLocked is the status of a guest of either kind.
func (s *Server) guestStatusLocked(v *vm) map[string]any {
	if v.kind == kindLXC {
		return s.ctStatusLocked(v)
	}
	return s.vmStatusLocked(v)
}

// listCTs is GET /nodes/{node}/lxc (API2/LXC.pm vmlist): vmstatus of the
// node's CTs, each only with VM.Audit on /vms/<vmid>.
func (s *Server) listCTs(_ context.Context, rq *request) (any, error) {
	return s.listGuests(rq, kindLXC)
}

// ctDestroyChecks are destroy_vm's early checks of the config (before the
// worker and again under its lock): protection, then the lock.
func ctDestroyChecks(v *vm) error {
	if v.conf["protection"] == "1" {
		return fail("can't remove CT %d - protection mode enabled", v.vmid)
	}
	return checkLock(v)
}

// deleteCT is DELETE /nodes/{node}/lxc/{vmid} (API2/LXC.pm destroy_vm):
// the checks, then a vzdestroy worker under the config lock that stops a
// running CT when force is set, frees its volume, drops its IPAM entries
// (delete_ifaces_ipams_ips), removes its ACLs and pool membership
// (pve-access-control remove_vm_access: always, unlike qemu-server's
// purge) and finally its config ("lock: destroyed" until then).
func (s *Server) deleteCT(_ context.Context, rq *request) (any, error) {
	vmid := s.vmid(rq)
	force, purge := rq.bool("force", false), rq.bool("purge", false)
	running := func(v *vm) bool { _, ok := s.ctPIDLocked(v); return ok }
	err := s.openGuest(kindLXC, rq, nil, func(v *vm) error {
		if err := ctDestroyChecks(v); err != nil {
			return err
		}
		if !force && running(v) {
			return fail("unable to destroy CT %d - container is running", vmid)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s.startTask(rq, "vzdestroy", strconv.Itoa(vmid), func(ctx context.Context, t *task) error {
		wasRunning := false
		v, unlock, err := s.lockGuest(ctx, kindLXC, vmid, func(v *vm) error {
			if err := ctDestroyChecks(v); err != nil {
				return err
			}
			wasRunning = running(v)
			if wasRunning && !force {
				return fail("unable to destroy CT %d - container is running", vmid)
			}
			return nil
		})
		if err != nil {
			return err
		}
		defer unlock()
		if wasRunning {
			t.logf("forced to stop CT %d before destroying!", vmid)
			if err := s.stopCT(ctx, v); err != nil {
				return err
			}
		}
		s.mu.Lock()
		old := v.conf
		v.conf = map[string]string{"lock": "destroyed"}
		s.mu.Unlock()
		if err := os.RemoveAll(s.vmDir(vmid)); err != nil {
			return fmt.Errorf("remove volumes: %w", err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		_ = s.ipamNICsOfLocked(vmid, old, nil, lxcNetMAC, "") // removals only: cannot fail
		s.removeVMAccessLocked(vmid, v.pool)
		if purge {
			t.logf("purging CT %d from related configurations..", vmid)
		}
		delete(s.vms, vmid)
		return nil
	}), nil
}

// removeVMAccessLocked is pve-access-control's remove_vm_access: the ACL
// entries on /vms/<vmid> and the guest's pool membership go.
func (s *Server) removeVMAccessLocked(vmid int, pool string) {
	s.removeVMACLsLocked(vmid)
	if p := s.pools[pool]; p != nil {
		delete(p.vms, vmid)
	}
}

// removeVMACLsLocked drops the ACL entries on /vms/<vmid>.
func (s *Server) removeVMACLsLocked(vmid int) {
	path := fmt.Sprintf("/vms/%d", vmid)
	kept := s.acl[:0]
	for _, e := range s.acl {
		if e.path != path {
			kept = append(kept, e)
		}
	}
	s.acl = kept
}

// ctSpecLocked is what the backend needs to start a CT, from its config:
// net0 (parse_lxc_network; the IPAM's address of its MAC), memory,
// cpulimit, hostname. The emulator runs unprivileged CTs with one NIC
// only, and says so.
func (s *Server) ctSpecLocked(v *vm) (CTSpec, error) {
	c := v.conf
	spec := CTSpec{VMID: v.vmid, Hostname: c["hostname"], Rootfs: v.rootBase, Disk: s.DiskDir(v.vmid),
		MemoryMiB: atoiDef(c["memory"], 512)}
	if c["unprivileged"] != "1" {
		return spec, fmt.Errorf("pveemu: the emulator runs unprivileged containers only")
	}
	if f, err := strconv.ParseFloat(c["cpulimit"], 64); err == nil {
		spec.CPUs = f
	}
	for k := range c {
		if reNetKey.MatchString(k) && k != "net0" {
			return spec, fmt.Errorf("pveemu: the emulator starts a container's net0 only (%s is set)", k)
		}
	}
	if val := c["net0"]; val != "" {
		n := parseLXCNet(val)
		mac, err := net.ParseMAC(n["hwaddr"])
		if err != nil {
			return spec, fmt.Errorf("net0: hwaddr: %w", err)
		}
		// the start's add_dhcp_mapping (pve-network Vnets.pm): the MAC's
		// address, one of the range when it has none
		dhcpIP, err := s.dhcpMappingIPLocked(n["bridge"], n["hwaddr"], v.vmid, c["hostname"])
		if err != nil {
			return spec, fmt.Errorf("net0: %w", err)
		}
		spec.Net = &CTNet{Name: n["name"], Bridge: n["bridge"], MAC: mac, IP: n["ip"], DHCPIP: dhcpIP}
		if gw := n["gw"]; gw != "" {
			if spec.Net.Gateway, err = netip.ParseAddr(gw); err != nil {
				return spec, fmt.Errorf("net0: gw: %w", err)
			}
		}
		if n["bridge"] == "" {
			return spec, fmt.Errorf("missing bridge configuration")
		}
		if !s.bridgeOnLocked(s.vmNodeLocked(v), n["bridge"]) {
			return spec, fmt.Errorf("bridge '%s' does not exist", n["bridge"])
		}
	}
	return spec, nil
}
