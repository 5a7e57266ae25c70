package testvm

import (
	"context"
	"encoding/json"
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

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/internal/deathsig"
)

// GuestSpec describes a guest VM to start.
type GuestSpec struct {
	VMID int
	VNet string           // bridge to attach to ("": no NIC, the loopback only)
	MAC  net.HardwareAddr // nil = derived from VMID
	Disk string           // the guest's disk: overlay upper dir ("" = a fresh dir)
	// MemoryMiB caps the memory of the guest's cgroup scope, as the VM's
	// RAM caps a real guest (0: no cap).
	MemoryMiB int
	// CPUs caps the CPU time of the guest's scope at that many CPUs, as a
	// VM's vCPUs (or its cpulimit) cap a real guest's (0: no cap).
	CPUs float64
	// IP is the address the zone's DHCP hands the MAC (zero: one of its
	// range). Either way the MAC is added to the zone's ethers file first:
	// the zone's dnsmasq answers no other (dhcp-ignore=tag:!known).
	IP netip.Addr
	// NoAgent starts the guest without qemu-ga and without an agent
	// socket: a VM whose agent is off (a VulnHub image, an appliance).
	// It is up once DHCP gave it an address (at once on a vnet without
	// DHCP).
	NoAgent bool
	// Firewall plugs the NIC as Proxmox does one with firewall=1 under
	// the iptables firewall (pve-common src/PVE/Network.pm tap_plug,
	// $create_firewall_bridge_linux): the tap on its own bridge
	// fwbr<vmid>i0, joined to the vnet by the veth pair fwln<vmid>i0 (on
	// fwbr) / fwpr<vmid>p0 (on the vnet), with
	// net.bridge.bridge-nf-call-iptables=1 in the node's namespace as
	// pve-firewall's enable_bridge_firewall sets it. The VM's config says
	// firewall=1 on net0.
	Firewall bool
}

// Guest is a running guest: its own network, PID, mount and UTS
// namespaces, an overlay of the host root as its root filesystem, tini as
// init, dhclient on eth0 (a guest of no VNet has no eth0, its loopback
// only) and the real qemu-ga answering on Socket (none for a guest started
// with NoAgent).
type Guest struct {
	VMID   int
	NS     string // the guest's network namespace
	Socket string // <QGADir>/<vmid>.qga ("" without an agent)
	Disk   string
	MAC    net.HardwareAddr
	VNet   string
	// Firewall: the NIC sits behind a firewall bridge (GuestSpec.Firewall);
	// its port on the vnet is fwpr<vmid>p0, its tap tap<vmid>i0 is on
	// fwbr<vmid>i0.
	Firewall bool

	ipv4 netip.Addr
	ipv6 netip.Addr
	cmd  *exec.Cmd
	done chan struct{}
	// proxy listens on Socket and forwards to qemu-ga's own socket
	// (qgaproxy.go): it emulates qemu-ga's frozen state.
	proxy *agentProxy
}

// agentSocket is the path of qemu-ga's own listening socket, behind the
// proxy on Socket.
func (g *Guest) agentSocket() string { return strings.TrimSuffix(g.Socket, ".qga") + ".ga" }

// qgaFrozenReason is the host's qemu-ga's frozen-state reason
// (frozenReason), asked once per bed.
func (b *Bed) qgaFrozenReason(ctx context.Context) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.qgaReason == "" {
		out, _ := output(ctx, "qemu-ga", "-V")
		first, _, _ := strings.Cut(string(out), "\n")
		b.qgaReason = frozenReason(strings.TrimSpace(first))
	}
	return b.qgaReason
}

// SetAgentFrozen puts guest vmid's agent in qemu-ga's frozen state, or
// ends it, without freezing any file system: while frozen the proxy in
// front of qemu-ga answers the commands qemu-ga refuses then with its
// refusal (qgaproxy.go).
func (b *Bed) SetAgentFrozen(vmid int, frozen bool) error {
	g, ok := b.Guest(vmid)
	if !ok || g.proxy == nil {
		return fmt.Errorf("testvm: guest %d is not running", vmid)
	}
	g.proxy.frozen.Store(frozen)
	return nil
}

// IPv4 is the address the guest took by DHCP (zero when the vnet's DHCP
// leases it none).
func (g *Guest) IPv4() netip.Addr { return g.ipv4 }

// IPv6 is the guest's address in its vnet's routed ULA prefix.
func (g *Guest) IPv6() netip.Addr { return g.ipv6 }

// Alive reports whether the guest's init is still running.
func (g *Guest) Alive() bool {
	select {
	case <-g.done:
		return false
	default:
		return true
	}
}

// Capabilities a guest's root does not get: nothing that reaches past its
// own namespaces (mounts, devices, modules, raw I/O, the clock, the
// kernel log, tracing other processes).
const guestDropCaps = "-sys_admin,-sys_module,-sys_rawio,-mknod,-sys_boot,-sys_time,-syslog," +
	"-mac_admin,-mac_override,-bpf,-perfmon,-audit_control,-audit_write,-audit_read,-sys_ptrace," +
	"-lease,-linux_immutable,-sys_pacct,-wake_alarm,-block_suspend,-checkpoint_restore,-ipc_lock,-sys_resource,-sys_tty_config"

// guestSetup runs as PID 1 of the guest's new PID namespace, in a private
// mount namespace: it builds the guest's root and execs tini in it.
//
// The guest's UTS namespace is made by a child user namespace (a holder
// process, unshare --user --uts, killed once the guest joined): root of a
// VM sets its own hostname, and sethostname asks for CAP_SYS_ADMIN in the
// user namespace that owns the UTS namespace, which the guest's root,
// without CAP_SYS_ADMIN, has in a child user namespace owned by its uid
// (user_namespaces(7): the owner in the parent namespace has every
// capability in it). That namespace owns nothing else (the network, mount
// and PID namespaces are the initial one's), so this gives no more than
// the unprivileged user namespace any guest process may make.
const guestSetup = `set -eu
R="$1"; D="$2"
mkdir -p "$D/upper" "$D/work" "$R"
mount -t overlay overlay -o "lowerdir=/,upperdir=$D/upper,workdir=$D/work" "$R"
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
mount --bind "$R/proc/sys" "$R/proc/sys"
mount -o remount,bind,ro "$R/proc/sys"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/tmp"
mount -t tmpfs -o mode=755,nosuid tmpfs "$R/run"
mount -t tmpfs -o mode=755,nosuid tmpfs "$R/dev"
for d in null zero full random urandom tty; do
  touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"
done
mkdir -p "$R/dev/shm" "$R/dev/pts" "$R/run/qga" "$R/var/lib/qemu-ga" "$R/var/lib/dhcp"
ln -s /proc/self/fd "$R/dev/fd"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/dev/shm"
cp /etc/resolv.conf "$R/run/resolv.conf.host" 2>/dev/null || true
unshare --user --uts -- sleep infinity & H=$!
while [ "$(readlink "$R/proc/$H/ns/uts")" = "$(readlink "$R/proc/1/ns/uts")" ]; do sleep 0.01; done
exec nsenter --uts="$R/proc/$H/ns/uts" -- /bin/sh -c 'kill -KILL "$1"; hostname "$2"; shift 2; exec "$@"' uts "$H" "$3" \
  setpriv --bounding-set ` + guestDropCaps + ` chroot "$R" /usr/bin/tini -s -g -- /bin/sh -c "$4"
`

// guestInit runs inside the guest's root under tini: DHCP in the
// background, then qemu-ga on the listening socket the host passed as fd 3
// (systemd socket activation, so the socket lives on the host side where
// the guest cannot replace it).
//
// dhclient's own defaults wait ten seconds before the second DISCOVER and
// back off to fifteen: one DISCOVER lost while a zone's dnsmasq restarts
// (every SDN apply restarts them) cost a guest half a minute. The bed's
// client asks every second and never gives up, as a guest whose network
// comes up late would want; it sends its host name as Debian's default
// configuration does (the zone's dnsmasq learns the guest's name from it).
const guestInit = guestNet + guestAgent

// guestAgent is the agent part of guestInit: qemu-ga on fd 3.
const guestAgent = `export LISTEN_FDS=1
LISTEN_PID=$$ exec qemu-ga -m unix-listen -p /run/qga/qga.sock -t /var/lib/qemu-ga -f /run/qemu-ga.pid
`

// guestNet is the network part of guestInit: DHCP on eth0 in the
// background.
const guestNet = guestResolv + `printf 'send host-name = gethostname();\ninitial-interval 1;\nbackoff-cutoff 2;\ntimeout 3600;\nretry 1;\nrequest subnet-mask, broadcast-address, routers, domain-name, domain-name-servers, host-name;\n' > /run/dhclient.conf
dhclient -4 -nw -cf /run/dhclient.conf -lf /var/lib/dhcp/dhclient.eth0.leases -pf /run/dhclient.pid eth0 </dev/null >/dev/null 2>&1
`

// guestInitNoAgent is guestInit of a guest without an agent: DHCP, and
// nothing else (tini keeps the guest up and reaps dhclient's children).
const guestInitNoAgent = guestNet + guestIdle

// guestIdle ends the init of a guest without an agent: it keeps the guest
// up.
const guestIdle = `exec sleep infinity
`

// guestResolv starts every guest's init with an empty resolv.conf (a
// guest without any NIC keeps it so: there is no eth0 to run DHCP on).
const guestResolv = `: > /etc/resolv.conf
`

// guestScript is the init of a guest with a NIC (net) or without, with
// an agent or without.
func guestScript(net, agent bool) string {
	switch {
	case net && agent:
		return guestInit
	case net:
		return guestInitNoAgent
	case agent:
		return guestResolv + guestAgent
	default:
		return guestResolv + guestIdle
	}
}

// guestEnv is the whole environment of every process the bed starts in a
// guest (its init, dhclient and qemu-ga, and the commands it runs inside
// one): a guest's own, as a VM's agent starts with its system's
// environment, never that of whoever started the bed (issue 34: a bed
// guest's `env` showed the operator's HOME, OLDPWD, CA and toolchain
// variables, and so would any API key exported in that shell).
func guestEnv() []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}
}

// runInGuest runs argv (which enters a guest's namespaces, e.g. nsenter)
// with guestEnv as its whole environment.
func runInGuest(ctx context.Context, argv ...string) error {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = guestEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func macFor(vmid int) net.HardwareAddr {
	return net.HardwareAddr{0xbc, 0x24, 0x11, byte(vmid >> 16), byte(vmid >> 8), byte(vmid)}
}

// StartGuest starts a guest on a vnet and returns once its agent answers
// and DHCP gave it an address (on a vnet with DHCP).
func (b *Bed) StartGuest(ctx context.Context, s GuestSpec) (g *Guest, err error) {
	if s.VMID < 100 || s.VMID > 999999999 {
		return nil, fmt.Errorf("testvm: vmid %d out of range", s.VMID)
	}
	var vnet VNet
	if s.VNet != "" {
		var ok bool
		if vnet, ok = b.vnet(s.VNet); !ok {
			return nil, fmt.Errorf("testvm: vnet %q does not exist", s.VNet)
		}
		if s.MAC == nil {
			s.MAC = macFor(s.VMID)
		}
		if err := b.addDHCPHost(s.VNet, s.MAC, s.IP); err != nil {
			return nil, fmt.Errorf("testvm: guest %d: %w", s.VMID, err)
		}
	}
	gdir := filepath.Join(b.dir, "guests", strconv.Itoa(s.VMID))
	if s.Disk == "" {
		s.Disk = filepath.Join(gdir, "disk")
	}
	g = &Guest{VMID: s.VMID, NS: b.GuestNS(s.VMID), Socket: filepath.Join(b.QGADir(), strconv.Itoa(s.VMID)+".qga"),
		Disk: s.Disk, MAC: s.MAC, VNet: s.VNet, Firewall: s.Firewall && s.VNet != "", done: make(chan struct{})}
	if s.NoAgent {
		g.Socket = ""
	}
	b.mu.Lock()
	if _, ok := b.guests[s.VMID]; ok || b.closed {
		b.mu.Unlock()
		return nil, fmt.Errorf("testvm: guest %d already running (or bed closed)", s.VMID)
	}
	b.guests[s.VMID] = g
	b.mu.Unlock()
	defer func() {
		if err != nil {
			_ = b.StopGuest(context.WithoutCancel(ctx), s.VMID)
			g = nil
		}
	}()
	if err := os.MkdirAll(gdir, 0o700); err != nil {
		return nil, err
	}
	if err := b.plugGuest(ctx, g, vnet); err != nil {
		return nil, fmt.Errorf("testvm: guest %d: %w", s.VMID, err)
	}
	if err := b.writeVMConf(g); err != nil {
		return nil, fmt.Errorf("testvm: guest %d: config: %w", s.VMID, err)
	}
	script, extra := guestScript(s.VNet != "", !s.NoAgent), []*os.File(nil)
	if !s.NoAgent {
		lf, err := b.agentListener(ctx, g)
		if err != nil {
			return nil, err
		}
		defer lf.Close()
		extra = []*os.File{lf}
	}
	logf, err := os.Create(filepath.Join(gdir, "console.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	procs, err := b.makeScope(s.VMID, s.MemoryMiB, s.CPUs)
	if err != nil {
		return nil, fmt.Errorf("testvm: guest %d: %w", s.VMID, err)
	}
	// The guest joins its scope (qemu.slice/<vmid>.scope) before it execs
	// anything, so every process it ever has is counted there.
	cmd := exec.Command("/bin/sh", "-c", joinScope(procs), "join-scope", "ip", "netns", "exec", g.NS,
		"unshare", "--pid", "--fork", "--kill-child", "--mount", "--uts", "--ipc", "--propagation", "private",
		"/bin/sh", "-c", guestSetup, "guest-setup", filepath.Join(gdir, "root"), s.Disk, "vm"+strconv.Itoa(s.VMID), script)
	cmd.Env = guestEnv()
	cmd.ExtraFiles = extra
	cmd.Stdout, cmd.Stderr = logf, logf
	// Started through deathsig: a bare Pdeathsig killed a guest whenever
	// the Go thread that had forked it ended (its agent gone mid-test).
	waited, err := deathsig.Start(cmd, syscall.SIGKILL)
	if err != nil {
		return nil, fmt.Errorf("testvm: guest %d: %w", s.VMID, err)
	}
	g.cmd = cmd
	// the error path below may set g to nil before Wait returns
	guest, done, console := g, g.done, logf.Name()
	go func() {
		err := <-waited
		// Said for every end, asked for or not: a guest that dies under
		// a test shows how here (its signal, or its exit code; a qemu-ga
		// that quits by itself, as on a read error of its client socket,
		// ends tini and the launcher with its status 0: a nil status). An
		// end nobody asked for also shows the end of the guest's console
		// (qemu-ga's errors).
		if b.stopAsked(s.VMID, guest) {
			b.log.Info("guest process ended", "vmid", s.VMID, "status", err)
		} else {
			b.log.Warn("guest process ended unasked", "vmid", s.VMID, "status", err, "console", consoleTail(console))
		}
		close(done)
	}()
	if err := b.waitGuest(ctx, g, s.VNet != "" && vnet.leases(s.IP), !s.NoAgent, filepath.Join(gdir, "console.log")); err != nil {
		return nil, err
	}
	b.log.Info("guest up", "vmid", s.VMID, "vnet", s.VNet, "ipv4", g.ipv4)
	return g, nil
}

// plugGuest makes guest g's network namespace with its loopback up and,
// on a vnet, its NIC: eth0 of g's MAC, the peer of the node's tap
// tap<vmid>i0 on the vnet's bridge (or, for a guest with Firewall, on its
// firewall bridge: firewallBridge), with an address of the vnet's routed
// ULA prefix. A guest of no vnet (a VM without any NIC, as qemu-server's
// config_to_command starts one with no netN: -nodefaults, no -netdev)
// has the loopback only.
func (b *Bed) plugGuest(ctx context.Context, g *Guest, vnet VNet) error {
	steps := [][]string{{"ip", "netns", "add", g.NS}}
	if g.VNet != "" {
		node := b.NodeNS()
		tap := "tap" + strconv.Itoa(g.VMID) + "i0"
		host, peer := b.name+"h"+strconv.Itoa(g.VMID), b.name+"g"+strconv.Itoa(g.VMID)
		g.ipv6 = ulaAddr(vnet, g.VMID%65000+2)
		steps = append(steps,
			[]string{"ip", "link", "add", host, "type", "veth", "peer", "name", peer},
			[]string{"ip", "link", "set", host, "netns", node},
			[]string{"ip", "link", "set", peer, "netns", g.NS},
			[]string{"ip", "-n", node, "link", "set", host, "name", tap})
		if g.Firewall {
			steps = append(steps, firewallBridge(node, g.VMID, tap, g.VNet)...)
		} else {
			steps = append(steps, []string{"ip", "-n", node, "link", "set", tap, "master", g.VNet, "up"})
		}
		steps = append(steps,
			[]string{"ip", "-n", g.NS, "link", "set", peer, "name", "eth0"},
			[]string{"ip", "-n", g.NS, "link", "set", "eth0", "address", g.MAC.String()},
			[]string{"ip", "netns", "exec", g.NS, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0", "net.ipv6.conf.eth0.accept_dad=0", "net.ipv6.conf.eth0.accept_ra=0"})
	}
	steps = append(steps, []string{"ip", "-n", g.NS, "link", "set", "lo", "up"})
	if g.VNet != "" {
		steps = append(steps,
			[]string{"ip", "-n", g.NS, "link", "set", "eth0", "up"},
			[]string{"ip", "-n", g.NS, "addr", "add", netip.PrefixFrom(g.ipv6, 64).String(), "dev", "eth0", "nodad"},
			[]string{"ip", "-n", g.NS, "-6", "route", "add", "default", "via", ulaAddr(vnet, 1).String(), "dev", "eth0"})
	}
	for _, st := range steps {
		if err := run(ctx, st...); err != nil {
			return err
		}
	}
	return nil
}

// FirewallBridgeNames are the links pve-common makes for NIC n of guest
// vmid with the firewall on (src/PVE/Network.pm $compute_fwbr_names):
// the firewall bridge, the veth end on it and the veth end on the vnet.
func FirewallBridgeNames(vmid, n int) (fwbr, fwln, fwpr string) {
	id, dev := strconv.Itoa(vmid), strconv.Itoa(n)
	return "fwbr" + id + "i" + dev, "fwln" + id + "i" + dev, "fwpr" + id + "p" + dev
}

// firewallBridge is the steps that plug tap into vnet in node behind a
// firewall bridge, in the order of pve-common's
// $create_firewall_bridge_linux: the bridge fwbr up, the veth pair
// fwln/fwpr, fwpr on the vnet, fwln and then the tap on fwbr. The node's
// bridged IPv4 and IPv6 pass the IP hooks, as pve-firewall's
// enable_bridge_firewall (src/PVE/Firewall.pm) sets it.
func firewallBridge(node string, vmid int, tap, vnet string) [][]string {
	fwbr, fwln, fwpr := FirewallBridgeNames(vmid, 0)
	return [][]string{
		{"ip", "netns", "exec", node, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1", "net.bridge.bridge-nf-call-ip6tables=1"},
		{"ip", "-n", node, "link", "add", fwbr, "type", "bridge"},
		{"ip", "-n", node, "link", "set", fwbr, "up"},
		{"ip", "-n", node, "link", "add", fwln, "type", "veth", "peer", "name", fwpr},
		{"ip", "-n", node, "link", "set", fwpr, "master", vnet, "up"},
		{"ip", "-n", node, "link", "set", fwln, "master", fwbr, "up"},
		{"ip", "-n", node, "link", "set", tap, "master", fwbr, "up"},
	}
}

// agentListener makes guest g's agent socket on the host side (handed to
// its qemu-ga as fd 3), with the proxy's in front of it on g.Socket, and
// returns the listening socket's file.
func (b *Bed) agentListener(ctx context.Context, g *Guest) (*os.File, error) {
	_ = os.Remove(g.Socket)
	_ = os.Remove(g.agentSocket())
	pln, err := net.Listen("unix", g.Socket)
	if err != nil {
		return nil, fmt.Errorf("testvm: guest %d: agent proxy socket: %w", g.VMID, err)
	}
	g.proxy = startAgentProxy(pln, g.agentSocket(), b.qgaFrozenReason(ctx))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: g.agentSocket(), Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("testvm: guest %d: agent socket: %w", g.VMID, err)
	}
	ln.SetUnlinkOnClose(false)
	lf, err := ln.File()
	_ = ln.Close()
	return lf, err
}

// stopAsked reports whether guest g's end was asked for: StopGuest took
// it off the bed, or the bed is closing.
func (b *Bed) stopAsked(vmid int, g *Guest) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed || b.guests[vmid] != g
}

// consoleTail is the last lines of a guest's console log (at most 2 KiB).
func consoleTail(path string) string {
	log, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(string(log[max(0, len(log)-2048):]))
}

// guestReadyTimeout bounds a guest's boot: agent up, lease and route in.
// A guest is ready in well under a second on an idle machine; the bound is
// for a loaded two-core CI machine running several beds at once.
const guestReadyTimeout = 90 * time.Second

// waitGuest waits for the agent to answer guest-ping (when the guest has
// one: agent) and, when the vnet's DHCP leases it an address (VNet.leases),
// eth0 to have a DHCP address and the default route the lease gives. A
// guest on a vnet without DHCP, or whose MAC is mapped to no address on a
// vnet of a static range, gets no IPv4 address (its dhclient asks in vain,
// as a real guest's would): it is up once its agent answers (at once
// without one).
func (b *Bed) waitGuest(ctx context.Context, g *Guest, dhcp, agent bool, console string) error {
	ctx, cancel := context.WithTimeout(ctx, guestReadyTimeout)
	defer cancel()
	agentOK := !agent
	for {
		if !agentOK {
			agentOK = pingAgent(ctx, g.Socket) == nil
		}
		if agentOK && dhcp && !g.ipv4.IsValid() {
			g.ipv4 = guestIPv4(g.NS)
		}
		if agentOK && (g.ipv4.IsValid() || !dhcp) {
			return nil
		}
		select {
		case <-g.done:
			log, _ := os.ReadFile(console)
			return fmt.Errorf("testvm: guest %d exited: %s", g.VMID, strings.TrimSpace(string(log)))
		case <-ctx.Done():
			log, _ := os.ReadFile(console)
			return fmt.Errorf("testvm: guest %d not ready (agent %v, dhcp %v): %w: %s", g.VMID, agentOK, g.ipv4.IsValid(), ctx.Err(), strings.TrimSpace(string(log)))
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func guestIPv4(ns string) netip.Addr {
	return nsIPv4(func() (netns.NsHandle, error) { return netns.GetFromName(ns) }, "eth0", true)
}

// nsIPv4 is the IPv4 address of link ifname in the network namespace open
// returns, once it has one (and, with needRoute, a default route: the
// DHCP client sets the address before the default route, so a guest
// counts as leased only with both; every bed vnet offers a router).
func nsIPv4(open func() (netns.NsHandle, error), ifname string, needRoute bool) netip.Addr {
	h, err := open()
	if err != nil {
		return netip.Addr{}
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		return netip.Addr{}
	}
	defer nl.Close()
	l, err := nl.LinkByName(ifname)
	if err != nil {
		return netip.Addr{}
	}
	if needRoute {
		routes, err := nl.RouteList(l, netlink.FAMILY_V4)
		if err != nil {
			return netip.Addr{}
		}
		hasDefault := false
		for _, r := range routes {
			if (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.Gw != nil {
				hasDefault = true
			}
		}
		if !hasDefault {
			return netip.Addr{}
		}
	}
	addrs, err := nl.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			return ip
		}
	}
	return netip.Addr{}
}

// pingAgent is the bed's own readiness check: one guest-ping. The real
// client lives in sandboxapi/qga; the bed keeps this so it depends on
// nothing it tests.
func pingAgent(ctx context.Context, sock string) error {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(`{"execute":"guest-ping"}` + "\n")); err != nil {
		return err
	}
	var reply struct {
		Return *json.RawMessage `json:"return"`
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(buf[:n], &reply); err != nil || reply.Return == nil {
		return errors.New("no guest-ping reply")
	}
	return nil
}

// StopGuest kills the guest (its whole PID namespace) and removes its
// namespace, link and socket. Its disk stays.
func (b *Bed) StopGuest(ctx context.Context, vmid int) error {
	b.mu.Lock()
	g, ok := b.guests[vmid]
	delete(b.guests, vmid)
	b.mu.Unlock()
	if !ok {
		return fmt.Errorf("testvm: guest %d is not running", vmid)
	}
	if g.cmd != nil && g.cmd.Process != nil {
		// Kill the guest's processes first and let unshare, still alive,
		// reap its child: killing unshare first leaves the guest's init a
		// zombie of the host's PID 1, in the guest's cgroup until reaped.
		if pids, _ := output(ctx, "ip", "netns", "pids", g.NS); len(pids) > 0 {
			for _, p := range strings.Fields(string(pids)) {
				if pid, err := strconv.Atoi(p); err == nil && pid != g.cmd.Process.Pid {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		select {
		case <-g.done:
		case <-time.After(5 * time.Second):
			_ = g.cmd.Process.Kill()
			<-g.done
		}
	}
	var errs []error
	// Anything left in the namespace (there should be nothing).
	if pids, _ := output(ctx, "ip", "netns", "pids", g.NS); len(pids) > 0 {
		for _, p := range strings.Fields(string(pids)) {
			if pid, err := strconv.Atoi(p); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	if err := run(ctx, "ip", "netns", "del", g.NS); err != nil && !strings.Contains(err.Error(), "No such file") {
		errs = append(errs, err)
	}
	_ = run(ctx, "ip", "-n", b.NodeNS(), "link", "del", "tap"+strconv.Itoa(vmid)+"i0")
	if g.Firewall {
		// as pve-common's $cleanup_firewall_bridge: the veth pair, then
		// the bridge
		fwbr, fwln, _ := FirewallBridgeNames(vmid, 0)
		_ = run(ctx, "ip", "-n", b.NodeNS(), "link", "del", fwln)
		_ = run(ctx, "ip", "-n", b.NodeNS(), "link", "del", fwbr)
	}
	if err := b.removeScope(vmid); err != nil {
		errs = append(errs, err)
	}
	if g.proxy != nil {
		g.proxy.close()
	}
	if g.Socket != "" {
		_ = os.Remove(g.Socket)
		_ = os.Remove(g.agentSocket())
	}
	b.detachAllBlocks(ctx, vmid)
	_ = os.Remove(b.vmConfPath(vmid))
	_ = os.RemoveAll(filepath.Join(b.dir, "guests", strconv.Itoa(vmid), "root"))
	return errors.Join(errs...)
}

// Guest returns a running guest.
func (b *Bed) Guest(vmid int) (*Guest, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	g, ok := b.guests[vmid]
	return g, ok
}

// HasVNet reports whether a zone the bed runs has the vnet (its bridge
// is on the node).
func (b *Bed) HasVNet(name string) bool {
	_, ok := b.vnet(name)
	return ok
}

func (b *Bed) vnet(name string) (VNet, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, zs := range b.zones {
		for _, v := range zs.zone.VNets {
			if v.Name == name {
				return v, true
			}
		}
	}
	return VNet{}, false
}

// dnsReady reports whether the zone's dnsmasq answers its local name.
func (b *Bed) dnsReady(z Zone) bool {
	ok := false
	_ = b.Do(b.NodeNS(), func() error {
		c := &dns.Client{Timeout: 300 * time.Millisecond}
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(LocalName(z.ID)), dns.TypeA)
		r, _, err := c.Exchange(m, net.JoinHostPort(z.VNets[0].Gateway.String(), "53"))
		ok = err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) > 0
		return nil
	})
	return ok
}
