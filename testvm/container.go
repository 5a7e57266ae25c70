package testvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/internal/deathsig"
	"github.com/pve-inspect/pve-inspect/testvm/sysbox"
)

// A container is an unprivileged LXC container as pve-container runs one:
// Debian's lxc (lxc-start -F, as pve-container@.service starts it) with the
// configuration pve-container's update_lxc_config writes (lxcConfig), root
// inside mapped to CTIDOffset outside, on a zone bridge of the node.
//
// Where the bed differs from a node, and why:
//
//   - The node is a network namespace, and lxc needs two views of it: its
//     veth is made in the namespace lxc-start runs in, and lxc checks the
//     bridge in /sys/class/net, which shows the links of the namespace
//     sysfs was mounted from. So lxc-start runs in a mount namespace of its
//     own (a slave of the host's) inside the node's network namespace,
//     with a sysfs mounted from there and the host's cgroup trees moved
//     onto it. `ip netns exec` does not do: it mounts a fresh sysfs and
//     with it hides /sys/fs/cgroup, and lxc then finds no cgroup and the
//     container's systemd cannot create its own.
//   - The root file system is an overlay: the template's root, shifted to
//     the unprivileged range once and cached (CTRootfs, a linked clone's
//     base volume), under a per-container upper directory (its own
//     volume). The bed mounts it on <lxc dir>/rootfs before lxc-start, as
//     pve-container's pre-start hook mounts the volume there, inside that
//     private mount namespace, so no mount reaches the host's namespace
//     and all go with the container. Copying the root per container would
//     cost 250 MB and seconds each; shifting through an idmapped mount
//     would leave the files owned by 0 on disk, where a node's are owned
//     by 100000 (what the daemon's file operations will meet).
//   - The veth joins its bridge through lxc.net.0.link (lxc attaches it);
//     on a node pve-container's lxcnetaddbr hook does (tap_plug).
//   - The cgroups are the bed's: lxc/<vmid> and lxc.monitor/<vmid> under
//     CgroupParent, not under the hierarchy's root, so beds run side by
//     side. lxc keeps one empty lxc.pivot cgroup at each hierarchy's root
//     (its monitor moves there before its own cgroup is removed), as on a
//     node; it is lxc's, shared by every container, and stays.
//   - AppArmor: pve-container writes "lxc.apparmor.profile = generated"
//     and its deny rules (make_apparmor_config). A host without AppArmor
//     (these machines: no /sys/kernel/security/apparmor) cannot load a
//     profile, and lxc then refuses a generated one; the container runs
//     unconfined there, said so in its config. Where AppArmor is enabled
//     the bed writes pve-container's lines.
//   - Memory and CPU caps: pve-container writes cgroup2 keys only (PVE 9
//     is cgroup v2 only); on a hybrid host the bed writes the v1 keys of
//     the same caps.

// CTIDOffset is the host uid and gid an unprivileged container's root is
// (pve-container LXC.pm update_lxc_config: "lxc.idmap = u 0 100000 65536").
const CTIDOffset = 100000

// ctRootfsPackages are what the containers' root gets on top of
// sysbox.BasePackages (systemd as init): ifupdown and a DHCP client, what
// Proxmox's Debian templates use to bring up the /etc/network/interfaces
// pve-container writes (Setup/Debian.pm setup_network).
var ctRootfsPackages = []string{"ifupdown", "isc-dhcp-client"}

// CTRootfs returns the containers' template root: a Debian root built with
// debootstrap (sysbox.EnsureRootfs) with every owner shifted by CTIDOffset,
// cached. It is read only: containers use it as their overlay's lower
// layer.
func CTRootfs(ctx context.Context) (string, error) {
	return sysbox.EnsureShiftedRootfs(ctx, sysbox.RootfsOptions{Packages: ctRootfsPackages}, CTIDOffset)
}

// ContainerSpec describes a container to start: what pve-container's
// vm_start and its pre-start hook take from the CT's config.
type ContainerSpec struct {
	VMID int
	// Hostname is the config's hostname: the UTS name ("CT<vmid>" when
	// empty) and /etc/hostname ("localhost" when empty, as Setup does).
	Hostname string
	// Rootfs is the base the container's root is an overlay of (CTRootfs
	// or another root shifted by CTIDOffset). Required.
	Rootfs string
	// Disk is the container's own volume: the overlay's upper and work
	// directories live in it ("" = a fresh directory of the bed).
	Disk string
	// MemoryMiB caps the container's memory (0: 512, pve-container's
	// default).
	MemoryMiB int
	// CPUs caps its CPU time (cpulimit; 0: no cap).
	CPUs float64
	// Net is net0 (nil: no network).
	Net *ContainerNet
	// Features are pve-container features turned on (none by default,
	// the only way the daemon accepts a container).
	Features ContainerFeatures
	// IDMap, when set, are raw lxc.idmap values ("u 0 100000 1000"): a
	// custom id map, which pve-container writes instead of its default
	// (update_lxc_config). It must map every owner of the root.
	IDMap []string
}

// ContainerFeatures are pve-container features of a CT's config
// (features: keyctl=1,nesting=1). The daemon refuses a container with any
// of them; the bed has them so that tests can show what the containment
// check's container rows see without the walls they remove.
type ContainerFeatures struct {
	// Keyctl drops the "keyctl errno 38" rule from the seccomp profile
	// (LXC.pm make_seccomp_config).
	Keyctl bool
	// Nesting sets lxc.apparmor.allow_nesting (LXC.pm
	// make_apparmor_config): lxc mounts fully visible proc and sysfs
	// instances at /dev/.lxc/proc and /dev/.lxc/sys (lxc's conf.c
	// nesting_helpers, whatever the LSM), so the container may mount new
	// ones; with AppArmor also "allow userns," instead of the deny mount
	// rules.
	Nesting bool
}

// ContainerNet is a container NIC: a net[n] of the CT's config.
type ContainerNet struct {
	Name   string           // the name inside ("eth0" when empty)
	Bridge string           // the vnet
	MAC    net.HardwareAddr // nil = derived from the VMID
	// IP is the config's ip: "dhcp", "manual", an IPv4 CIDR, or "" (no
	// IPv4 configuration).
	IP      string
	Gateway netip.Addr // gw, for a static IP
	// DHCPIP is the address the zone's DHCP hands the MAC (the IPAM's;
	// zero: one of its range). pve-container's pre-start hook maps it in
	// the zone's dnsmasq (add_dhcp_mapping), which answers no other MAC.
	DHCPIP netip.Addr
}

// Container is a running container.
type Container struct {
	VMID int
	// PID is the container's init on the host (what lxc-info -p says).
	PID int
	// Veth is its NIC's host side on the node (veth<vmid>i0), "" without
	// a NIC.
	Veth string
	MAC  net.HardwareAddr
	VNet string
	// Dir is its lxc directory (config, logs, the root's mount point).
	Dir string

	ipv4 netip.Addr
	cmd  *exec.Cmd
	done chan struct{}
}

// IPv4 is the address eth0 had when the container was up (zero without
// an IPv4 configuration).
func (c *Container) IPv4() netip.Addr { return c.ipv4 }

// Alive reports whether the container's monitor (lxc-start) still runs.
func (c *Container) Alive() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// LXCPath is the bed's lxc path (lxc-start -P), where each container has
// its directory, like /var/lib/lxc on a node.
func (b *Bed) LXCPath() string { return filepath.Join(b.dir, "lxc") }

// ctCgroupDirs returns the container's and its monitor's cgroup
// directories in every hierarchy mounted.
func (b *Bed) ctCgroupDirs(vmid int) []string {
	var out []string
	for _, h := range allHierarchies() {
		for _, d := range []string{"lxc", "lxc.monitor"} {
			out = append(out, filepath.Join(cgroupRoot, h, b.CgroupParent(), d, strconv.Itoa(vmid)))
		}
	}
	return out
}

// ctStartScript runs in a new mount namespace (a slave of the host's):
// it mounts the container's root ($1 lower, $2 the volume, $3 the lxc
// directory), then enters the node's network namespace ($4), mounts that
// namespace's sysfs with the host's cgroup trees moved onto it, and execs
// lxc-start in the foreground ($5 the lxc path, $6 the name).
const ctStartScript = `set -eu
mkdir -p "$2/upper" "$2/work"
mount -t overlay overlay -o "lowerdir=$1,upperdir=$2/upper,workdir=$2/work" "$3/rootfs"
exec nsenter --net="$4" -- /bin/sh -c '
set -eu
mount --rbind /sys/fs/cgroup "$1/cgroup"
mount -t sysfs sysfs /sys
mount --move "$1/cgroup" /sys/fs/cgroup
exec lxc-start -F -P "$2" -n "$3" -o "$1/lxc.log" -l INFO' lxc-node "$3" "$5" "$6"
`

// StartContainer starts an unprivileged container and returns once its
// init runs and, when net0 has an IPv4 configuration on a vnet that can
// give it (DHCP on a vnet with a DHCP range, or a static address), eth0
// has it.
func (b *Bed) StartContainer(ctx context.Context, s ContainerSpec) (c *Container, err error) {
	if s.VMID < 100 || s.VMID > 999999999 {
		return nil, fmt.Errorf("testvm: vmid %d out of range", s.VMID)
	}
	if s.Rootfs == "" {
		return nil, fmt.Errorf("testvm: container %d: no root file system", s.VMID)
	}
	// The overlay's mount options list the directories separated by ","
	// (and lower layers by ":").
	for _, p := range []string{s.Rootfs, s.Disk, b.dir} {
		if strings.ContainsAny(p, ",:") {
			return nil, fmt.Errorf("testvm: container %d: path %q has a ',' or ':', which an overlay's options cannot hold", s.VMID, p)
		}
	}
	if _, err := exec.LookPath("lxc-start"); err != nil {
		return nil, fmt.Errorf("testvm: container %d: lxc is not installed: %w", s.VMID, err)
	}
	var vnet VNet
	if s.Net != nil {
		n := *s.Net
		if n.Name == "" {
			n.Name = "eth0"
		}
		if n.MAC == nil {
			n.MAC = macFor(s.VMID)
		}
		if err := ctNetValid(n.IP); err != nil {
			return nil, fmt.Errorf("testvm: container %d: %w", s.VMID, err)
		}
		s.Net = &n
		var ok bool
		if vnet, ok = b.vnet(n.Bridge); !ok {
			return nil, fmt.Errorf("testvm: container %d: bridge '%s' does not exist", s.VMID, n.Bridge)
		}
		if err := b.addDHCPHost(n.Bridge, n.MAC, n.DHCPIP); err != nil {
			return nil, fmt.Errorf("testvm: container %d: %w", s.VMID, err)
		}
	}
	dir := filepath.Join(b.LXCPath(), strconv.Itoa(s.VMID))
	if s.Disk == "" {
		s.Disk = filepath.Join(b.dir, "ct-disks", strconv.Itoa(s.VMID))
	}
	if old, ok := b.Container(s.VMID); ok && !old.Alive() {
		// Its init powered off by itself: clean up after it first.
		_ = b.StopContainer(ctx, s.VMID)
	}
	c = &Container{VMID: s.VMID, Dir: dir, done: make(chan struct{})}
	if s.Net != nil {
		c.Veth, c.MAC, c.VNet = "veth"+strconv.Itoa(s.VMID)+"i0", s.Net.MAC, s.Net.Bridge
	}
	b.mu.Lock()
	if _, ok := b.guests[s.VMID]; ok || b.cts[s.VMID] != nil || b.closed {
		b.mu.Unlock()
		return nil, fmt.Errorf("testvm: guest or container %d already running (or bed closed)", s.VMID)
	}
	b.cts[s.VMID] = c
	b.mu.Unlock()
	defer func() {
		if err != nil {
			_ = b.StopContainer(context.WithoutCancel(ctx), s.VMID)
			c = nil
		}
	}()
	if err := b.prepareContainer(s, dir); err != nil {
		return nil, fmt.Errorf("testvm: container %d: %w", s.VMID, err)
	}
	if err := b.writeCTConf(c, s); err != nil {
		return nil, fmt.Errorf("testvm: container %d: config: %w", s.VMID, err)
	}
	logf, err := os.Create(filepath.Join(dir, "monitor.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command("unshare", "--mount", "--propagation", "slave", "--", "/bin/sh", "-c", ctStartScript, "ct-start",
		s.Rootfs, s.Disk, dir, "/run/netns/"+b.NodeNS(), b.LXCPath(), strconv.Itoa(s.VMID))
	cmd.Env = guestEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	waited, err := deathsig.Start(cmd, syscall.SIGKILL)
	if err != nil {
		return nil, fmt.Errorf("testvm: container %d: %w", s.VMID, err)
	}
	c.cmd = cmd
	done := c.done
	go func() {
		err := <-waited
		b.log.Info("container monitor ended", "vmid", s.VMID, "status", err)
		close(done)
	}()
	if err := b.waitContainer(ctx, c, s, vnet); err != nil {
		return nil, err
	}
	b.log.Info("container up", "vmid", s.VMID, "pid", c.PID, "ipv4", c.ipv4)
	return c, nil
}

// prepareContainer writes what pve-container writes before lxc-start:
// the lxc configuration and seccomp rules (update_lxc_config) and, in the
// container's volume, what its pre-start hook's Setup writes
// (ctSetupFiles).
func (b *Bed) prepareContainer(s ContainerSpec, dir string) error {
	for _, d := range []string{filepath.Join(dir, "rootfs"), filepath.Join(dir, "cgroup"), s.Disk} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// The upper directory is the merged root's top: it carries the base
	// root's owner and mode (the container's / is owned by its root).
	upper := filepath.Join(s.Disk, "upper")
	if err := mkdirLike(upper, s.Rootfs); err != nil {
		return err
	}
	for _, f := range ctSetupFiles(s) {
		if err := writeBeneath(upper, s.Rootfs, f.path, f.data); err != nil {
			return fmt.Errorf("setup %s: %w", f.path, err)
		}
	}
	seccomp, err := ctSeccompRules(s.Features)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.seccomp"), []byte(seccomp), 0o644); err != nil {
		return err
	}
	if v2 := cgroupHierarchies(); len(v2) == 1 && v2[0] == "" {
		// A pure v2 host: the memory and cpu controllers reach the
		// containers' cgroups through the bed's parent and its lxc.
		p := filepath.Join(cgroupRoot, b.CgroupParent())
		if err := os.MkdirAll(filepath.Join(p, "lxc"), 0o755); err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
		enableControllers(cgroupRoot, p, filepath.Join(p, "lxc"))
	}
	conf := lxcConfig(s, lxcHost{cgroupParent: b.CgroupParent(), dir: dir, appArmor: appArmorEnabled(), cgroupV2: onlyV2(), bridgeMTU: b.bridgeMTU(s)})
	return os.WriteFile(filepath.Join(dir, "config"), []byte(conf), 0o644)
}

// bridgeMTU is the MTU of net0's bridge on the node (1500 when it cannot
// be read): pve-container sets the veth's to it (read_bridge_mtu).
func (b *Bed) bridgeMTU(s ContainerSpec) int {
	if s.Net == nil {
		return 0
	}
	mtu := 1500
	_ = b.Do(b.NodeNS(), func() error {
		if i, err := net.InterfaceByName(s.Net.Bridge); err == nil {
			mtu = i.MTU
		}
		return nil
	})
	return mtu
}

// waitContainer waits for the container's init (lxc-info) and then for
// eth0's IPv4 configuration, as waitGuest does for a guest.
func (b *Bed) waitContainer(ctx context.Context, c *Container, s ContainerSpec, vnet VNet) error {
	ctx, cancel := context.WithTimeout(ctx, guestReadyTimeout)
	defer cancel()
	wantIP := s.Net != nil && (s.Net.IP == "dhcp" && vnet.leases(s.Net.DHCPIP) || s.Net.IP != "" && s.Net.IP != "dhcp" && s.Net.IP != "manual")
	wantRoute := s.Net != nil && (s.Net.IP == "dhcp" || s.Net.Gateway.IsValid())
	for {
		if c.PID == 0 {
			c.PID, _ = b.ContainerPID(ctx, c.VMID)
		}
		if c.PID != 0 && wantIP && !c.ipv4.IsValid() {
			c.ipv4 = nsIPv4(func() (netns.NsHandle, error) { return netns.GetFromPid(c.PID) }, s.Net.Name, wantRoute)
		}
		if c.PID != 0 && (c.ipv4.IsValid() || !wantIP) {
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("testvm: container %d exited: %s", c.VMID, ctLogs(c.Dir))
		case <-ctx.Done():
			return fmt.Errorf("testvm: container %d not ready (init pid %d, ipv4 %v): %w: %s", c.VMID, c.PID, c.ipv4, ctx.Err(), ctLogs(c.Dir))
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// ctLogs is the tail of a container's monitor and lxc logs, for errors.
func ctLogs(dir string) string {
	var parts []string
	for _, f := range []string{"monitor.log", "lxc.log", "console.log"} {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || len(data) == 0 {
			continue
		}
		if len(data) > 2000 {
			data = data[len(data)-2000:]
		}
		parts = append(parts, f+": "+strings.TrimSpace(string(data)))
	}
	return strings.Join(parts, "\n")
}

// LXCPrefix is the command prefix that runs an lxc tool (lxc-attach,
// lxc-info) inside the node's network namespace: a container's command
// socket is an abstract unix socket, which lives in the network namespace
// its monitor runs in. On a node the tools run as they are.
func (b *Bed) LXCPrefix() []string {
	return []string{"nsenter", "--net=/run/netns/" + b.NodeNS(), "--"}
}

// ContainerCgroupV2 is container vmid's cgroup directory in the unified
// (v2) hierarchy, what lxc.cgroup.dir.container names: on a node
// /sys/fs/cgroup/lxc/<vmid>, on the bed lxc/<vmid> under CgroupParent (in
// /sys/fs/cgroup/unified on a hybrid host). The container runs in its
// child ns (lxc.cgroup.dir.container.inner).
func (b *Bed) ContainerCgroupV2(vmid int) string {
	return filepath.Join(cgroupV2Root(), b.CgroupParent(), "lxc", strconv.Itoa(vmid))
}

// cgroupV2Root is where the cgroup v2 tree is mounted: the cgroup root on
// a host with it alone, its "unified" directory on a hybrid one.
func cgroupV2Root() string {
	if onlyV2() {
		return cgroupRoot
	}
	return filepath.Join(cgroupRoot, "unified")
}

// lxcTool runs an lxc tool on the bed's lxc path inside the node's
// network namespace (LXCPrefix).
func (b *Bed) lxcTool(ctx context.Context, tool string, vmid int, args ...string) ([]byte, error) {
	argv := append(b.LXCPrefix(), tool, "-P", b.LXCPath(), "-n", strconv.Itoa(vmid))
	return output(ctx, append(argv, args...)...)
}

// ContainerPID is the host pid of a running container's init, as lxc-info
// -p reports it (0 and an error when it does not run).
func (b *Bed) ContainerPID(ctx context.Context, vmid int) (int, error) {
	out, err := b.lxcTool(ctx, "lxc-info", vmid, "-s", "-p")
	if err != nil {
		return 0, err
	}
	// "State:          RUNNING" and "PID:            1234"
	var state, pid string
	for _, l := range strings.Split(string(out), "\n") {
		k, v, _ := strings.Cut(l, ":")
		switch strings.TrimSpace(k) {
		case "State":
			state = strings.TrimSpace(v)
		case "PID":
			pid = strings.TrimSpace(v)
		}
	}
	if state != "RUNNING" || pid == "" {
		return 0, fmt.Errorf("testvm: container %d: lxc-info: %q", vmid, strings.TrimSpace(string(out)))
	}
	return strconv.Atoi(pid)
}

// Container returns a running container.
func (b *Bed) Container(vmid int) (*Container, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, ok := b.cts[vmid]
	return c, ok
}

// StopContainer stops a container at once, as pve-container's vm_stop
// with kill does (lxc-stop --kill), and removes what the bed made for it:
// its lxc directory and any cgroup, veth or process lxc left. Its volume
// (Disk) stays.
func (b *Bed) StopContainer(ctx context.Context, vmid int) error {
	return b.stopContainer(ctx, vmid, false, ctStopGrace, "--kill")
}

// ShutdownContainer asks the container's init to power off (lxc-stop
// --timeout: lxc sends the halt signal systemd takes for a poweroff, as
// pve-container's vm_stop without kill does), killing it after timeout
// when force is set; without force (lxc-stop --nokill) a container that
// did not stop keeps running and an error is returned. A stopped
// container is cleaned up as StopContainer does.
func (b *Bed) ShutdownContainer(ctx context.Context, vmid int, timeout time.Duration, force bool) error {
	args := []string{"--timeout", strconv.Itoa(int(timeout.Seconds()))}
	if !force {
		args = append(args, "--nokill")
	}
	return b.stopContainer(ctx, vmid, !force, timeout+ctStopGrace, args...)
}

// ctStopGrace bounds the wait for a container's monitor to exit once
// lxc-stop returned.
const ctStopGrace = 10 * time.Second

// stopContainer runs lxc-stop with lxcStop for at most bound, then
// makes sure the container is gone and cleans up after it.
func (b *Bed) stopContainer(ctx context.Context, vmid int, mayStay bool, bound time.Duration, lxcStop ...string) error {
	b.mu.Lock()
	c, ok := b.cts[vmid]
	b.mu.Unlock()
	if !ok {
		return fmt.Errorf("testvm: container %d is not running", vmid)
	}
	if c.cmd != nil && c.Alive() {
		// lxc-stop is bounded too: one whose monitor hangs (a start
		// that failed half-way) hung a bench for 19 minutes; the kill
		// below ends the container without it
		sctx, cancel := context.WithTimeout(ctx, bound)
		_, stopErr := b.lxcTool(sctx, "lxc-stop", vmid, lxcStop...)
		cancel()
		select {
		case <-c.done:
		case <-time.After(ctStopGrace):
			if mayStay {
				return fmt.Errorf("testvm: container %d did not stop (%v)", vmid, stopErr)
			}
			// lxc-stop did not end it: kill its init (its PID
			// namespace goes with it), then the monitor; a frozen
			// container is thawed first, or its processes cannot die.
			b.thawCgroups(vmid)
			if c.PID > 0 {
				_ = syscall.Kill(c.PID, syscall.SIGKILL)
			}
			select {
			case <-c.done:
			case <-time.After(5 * time.Second):
				_ = c.cmd.Process.Kill()
				<-c.done
			}
		}
	}
	b.mu.Lock()
	delete(b.cts, vmid)
	b.mu.Unlock()
	var errs []error
	for _, d := range b.ctCgroupDirs(vmid) {
		if err := removeCgroupTree(d); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Veth != "" {
		_ = run(ctx, "ip", "-n", b.NodeNS(), "link", "del", c.Veth)
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		errs = append(errs, err)
	}
	_ = os.Remove(b.ctConfPath(vmid))
	return errors.Join(errs...)
}
