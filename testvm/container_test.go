package testvm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestLXCConfig: the lines pve-container's update_lxc_config writes for an
// unprivileged CT, with the bed's differences, per host.
func TestLXCConfig(t *testing.T) {
	spec := ContainerSpec{VMID: 123, Hostname: "box1", MemoryMiB: 256, CPUs: 1.5,
		Net: &ContainerNet{Name: "eth0", Bridge: "vneta", MAC: macFor(123), IP: "dhcp"}}
	for _, c := range []struct {
		name     string
		host     lxcHost
		want     []string
		wantNone []string
	}{
		{"hybrid, no AppArmor", lxcHost{cgroupParent: "pvei-bed-x", dir: "/d/123", bridgeMTU: 1450},
			[]string{
				"lxc.cgroup.relative = 0", "lxc.cgroup.dir.container = pvei-bed-x/lxc/123",
				"lxc.cgroup.dir.monitor = pvei-bed-x/lxc.monitor/123", "lxc.cgroup.dir.container.inner = ns",
				"lxc.include = /usr/share/lxc/config/userns.conf", "lxc.seccomp.profile = /d/123/rules.seccomp",
				"lxc.apparmor.profile = unconfined", "lxc.mount.auto = sys:mixed", "lxc.monitor.unshare = 1",
				"lxc.idmap = u 0 100000 65536", "lxc.idmap = g 0 100000 65536", "lxc.tty.max = 2",
				"lxc.uts.name = box1", "lxc.cgroup.memory.limit_in_bytes = 268435456",
				"lxc.cgroup.cpu.cfs_quota_us = 150000", "lxc.rootfs.path = /d/123/rootfs",
				"lxc.net.0.type = veth", "lxc.net.0.veth.pair = veth123i0", "lxc.net.0.hwaddr = BC:24:11:00:00:7B",
				"lxc.net.0.name = eth0", "lxc.net.0.mtu = 1450", "lxc.net.0.link = vneta",
			},
			[]string{"lxc.apparmor.allow_nesting", "lxc.console.path = none", "lxc.cgroup2.memory.max", "lxc.apparmor.profile = generated"}},
		{"v2, AppArmor", lxcHost{cgroupParent: "pvei-bed-x", dir: "/d/123", appArmor: true, cgroupV2: true, bridgeMTU: 1500},
			[]string{
				"lxc.apparmor.profile = generated", "lxc.apparmor.raw = deny mount -> /proc/,",
				"lxc.apparmor.raw = deny mount -> /sys/,", "lxc.cgroup2.memory.max = 268435456",
				"lxc.cgroup2.memory.high = 266338304", "lxc.cgroup2.memory.swap.max = 0",
				"lxc.cgroup2.cpu.max = 150000 100000",
			},
			[]string{"lxc.apparmor.allow_nesting", "unconfined", "lxc.cgroup.memory.limit_in_bytes"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := lxcConfig(spec, c.host)
			lines := map[string]bool{}
			for _, l := range strings.Split(got, "\n") {
				lines[l] = true
			}
			for _, w := range c.want {
				if !lines[w] {
					t.Errorf("missing line %q in\n%s", w, got)
				}
			}
			for _, n := range c.wantNone {
				if strings.Contains(got, n) {
					t.Errorf("has %q:\n%s", n, got)
				}
			}
		})
	}
	if got := lxcConfig(ContainerSpec{VMID: 7}, lxcHost{}); !strings.Contains(got, "lxc.uts.name = CT7\n") || strings.Contains(got, "lxc.net.0") {
		t.Errorf("no hostname, no NIC:\n%s", got)
	}
}

// TestLXCConfigFeatures: the lines of pve-container's nesting feature
// (allow_nesting with or without AppArmor), a raw id map instead of the
// default one, and the keyctl feature's seccomp profile without its rule.
func TestLXCConfigFeatures(t *testing.T) {
	spec := ContainerSpec{VMID: 124, Features: ContainerFeatures{Nesting: true, Keyctl: true},
		IDMap: []string{"u 0 100000 1000", "u 1000 1000 1"}}
	for _, c := range []struct {
		name     string
		host     lxcHost
		want     []string
		wantNone []string
	}{
		{"no AppArmor", lxcHost{dir: "/d/124"},
			[]string{"lxc.apparmor.profile = unconfined", "lxc.apparmor.allow_nesting = 1", "lxc.idmap = u 0 100000 1000", "lxc.idmap = u 1000 1000 1"},
			[]string{"lxc.idmap = u 0 100000 65536", "allow userns", "deny mount"}},
		{"AppArmor", lxcHost{dir: "/d/124", appArmor: true},
			[]string{"lxc.apparmor.profile = generated", "lxc.apparmor.allow_nesting = 1", "lxc.apparmor.raw = allow userns,"},
			[]string{"deny mount", "lxc.idmap = g 0 100000 65536"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := lxcConfig(spec, c.host)
			for _, w := range c.want {
				if !strings.Contains(got, w+"\n") {
					t.Errorf("missing line %q in\n%s", w, got)
				}
			}
			for _, n := range c.wantNone {
				if strings.Contains(got, n) {
					t.Errorf("has %q:\n%s", n, got)
				}
			}
		})
	}
	// lxc's common.seccomp (the lxc package, which make deps installs)
	for _, f := range []ContainerFeatures{{}, {Keyctl: true}} {
		rules, err := ctSeccompRules(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(rules, "keyctl errno 38") == f.Keyctl || !strings.Contains(rules, "socket errno 97") {
			t.Errorf("keyctl feature %v: rules\n%s", f.Keyctl, rules)
		}
	}
}

// TestCTSetupFiles: the interfaces file Setup/Debian.pm writes per ip
// value, and /etc/hostname.
func TestCTSetupFiles(t *testing.T) {
	lo := "auto lo\niface lo inet loopback\niface lo inet6 loopback\n\n"
	for _, c := range []struct {
		name       string
		spec       ContainerSpec
		interfaces string // "" = no interfaces file
		hostname   string
	}{
		{"dhcp", ContainerSpec{Hostname: "a.example", Net: &ContainerNet{Name: "eth0", IP: "dhcp"}},
			lo + "auto eth0\niface eth0 inet dhcp\n\n", "a\n"},
		{"static with gateway", ContainerSpec{Net: &ContainerNet{Name: "eth0", IP: "10.1.2.3/24", Gateway: netip.MustParseAddr("10.1.2.1")}},
			lo + "auto eth0\niface eth0 inet static\n\taddress 10.1.2.3/24\n\tgateway 10.1.2.1\n\n", "localhost\n"},
		{"no ip", ContainerSpec{Hostname: "b", Net: &ContainerNet{Name: "eth0"}}, lo, "b\n"},
		{"no NIC", ContainerSpec{Hostname: "c"}, "", "c\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := map[string]string{}
			for _, f := range ctSetupFiles(c.spec) {
				got[f.path] = f.data
			}
			if got["etc/network/interfaces"] != c.interfaces || got["etc/hostname"] != c.hostname {
				t.Errorf("interfaces %q hostname %q, want %q %q", got["etc/network/interfaces"], got["etc/hostname"], c.interfaces, c.hostname)
			}
			if _, ok := got["fastboot"]; !ok {
				t.Error("no /fastboot")
			}
		})
	}
}

// TestWriteBeneath: the bed's Setup writes into a container's volume as
// the host's root, so a symbolic link the container planted there must
// not redirect it: the write fails and the link's target is untouched.
// Missing directories take the base root's owner and mode.
func TestWriteBeneath(t *testing.T) {
	testkit.RequireRoot(t)
	lower, upper, outside := t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(lower, "etc", "network"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(lower, "etc", "network"), CTIDOffset, CTIDOffset+4); err != nil {
		t.Fatal(err)
	}
	if err := writeBeneath(upper, lower, "etc/network/interfaces", "auto lo\n"); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(upper, "etc", "network"), &st); err != nil || st.Uid != CTIDOffset || st.Gid != CTIDOffset+4 || st.Mode&0o777 != 0o750 {
		t.Errorf("made dir: %d:%d %o, %v", st.Uid, st.Gid, st.Mode&0o777, err)
	}
	if err := syscall.Stat(filepath.Join(upper, "etc", "network", "interfaces"), &st); err != nil || st.Uid != CTIDOffset {
		t.Errorf("file owner %d, %v", st.Uid, err)
	}
	for _, c := range []struct{ name, link, rel string }{
		{"directory link", "etc/hostdir", "etc/hostdir/hostname"},
		{"file link", "etc/hostname", "etc/hostname"},
	} {
		t.Run(c.name, func(t *testing.T) {
			target := filepath.Join(outside, "target")
			if c.name == "directory link" {
				target = outside
			}
			if err := os.Symlink(target, filepath.Join(upper, c.link)); err != nil {
				t.Fatal(err)
			}
			if err := writeBeneath(upper, lower, c.rel, "pwned\n"); err == nil {
				t.Error("wrote through a symbolic link")
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 0 {
				t.Errorf("the link's target got %v", ents)
			}
		})
	}
}

// TestContainerLifecycle starts an unprivileged container on a zone of the
// bed: its init runs as uid 100000 on the host under a seccomp filter, it
// gets the zone's DHCP address through its own DHCP client (ifupdown's
// dhclient, from the interfaces file the bed's Setup wrote) or the static
// address of its ip=, and a stop leaves nothing: no process, no veth, no
// cgroup, no mount, no lxc directory. A clean shutdown (the init powers
// off) does the same.
func TestContainerLifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, rootfs := ctBed(ctx, t)
	zone := twoZones()[0]
	if err := b.AddZone(ctx, zone); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		vmid     int
		ip       string // net0's ip=
		gw       string
		shutdown bool
	}{
		{"dhcp then stop", 201, "dhcp", "", false},
		{"dhcp then shutdown", 202, "dhcp", "", true},
		{"static then stop", 205, "10.10.1.50/24", "10.10.1.1", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			disk := filepath.Join(t.TempDir(), "disk")
			n := &ContainerNet{Bridge: "vneta", IP: c.ip}
			if c.gw != "" {
				n.Gateway = netip.MustParseAddr(c.gw)
			}
			ct, err := b.StartContainer(ctx, ContainerSpec{VMID: c.vmid, Hostname: fmt.Sprintf("ct%d", c.vmid), Rootfs: rootfs, Disk: disk,
				MemoryMiB: 256, Net: n})
			if err != nil {
				t.Fatal(err)
			}
			if pid, err := b.ContainerPID(ctx, c.vmid); err != nil || pid != ct.PID {
				t.Errorf("lxc-info -p: %d, %v; StartContainer said %d", pid, err, ct.PID)
			}
			if uid := procStatus(t, ct.PID, "Uid"); uid != "100000" {
				t.Errorf("the container's init runs as uid %s on the host, want 100000", uid)
			}
			if mode := procStatus(t, ct.PID, "Seccomp"); mode != "2" {
				t.Errorf("the container's init has seccomp mode %s, want 2 (a filter)", mode)
			}
			if c.ip == "dhcp" {
				leases, _ := os.ReadFile(b.leaseFile(zone.ID))
				if !zone.VNets[0].Subnet.Contains(ct.IPv4()) || !strings.Contains(string(leases), ct.IPv4().String()+" "+fmt.Sprintf("ct%d", c.vmid)) {
					t.Errorf("DHCP address %v (subnet %v), the zone's leases: %q", ct.IPv4(), zone.VNets[0].Subnet, leases)
				}
			} else if want := netip.MustParsePrefix(c.ip).Addr(); ct.IPv4() != want {
				t.Errorf("static address %v, want %v", ct.IPv4(), want)
			}
			if _, err := net.InterfaceByName(ct.Veth); err == nil {
				t.Errorf("the container's veth %s is in the host's namespace", ct.Veth)
			}
			if out, err := output(ctx, "ip", "-n", b.NodeNS(), "-o", "link", "show", ct.Veth); err != nil || !strings.Contains(string(out), "master vneta") {
				t.Errorf("veth on the node: %q, %v", out, err)
			}
			pid := ct.PID
			if c.shutdown {
				err = b.ShutdownContainer(ctx, c.vmid, 30*time.Second, false)
			} else {
				err = b.StopContainer(ctx, c.vmid)
			}
			if err != nil {
				t.Fatal(err)
			}
			assertContainerGone(t, b, ct, pid)
			if _, err := os.Stat(filepath.Join(disk, "upper", "etc", "hostname")); err != nil {
				t.Errorf("the container's volume lost its files: %v", err)
			}
		})
	}
}

// ctBed is a bed for container tests (closed when the test ends) and the
// containers' root; it needs root and lxc (a failure under CI).
func ctBed(ctx context.Context, t *testing.T) (*Bed, string) {
	t.Helper()
	testkit.RequireRoot(t, "lxc-start", "lxc-info", "lxc-stop", "debootstrap")
	rootfs, err := CTRootfs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Up(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b, rootfs
}

// TestContainerPoweredOff: a container whose init powers off by itself
// (systemd's SIGRTMIN+4, what `poweroff` inside sends) is no longer
// running, and the same VMID starts again.
func TestContainerPoweredOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, rootfs := ctBed(ctx, t)
	spec := ContainerSpec{VMID: 204, Rootfs: rootfs, Disk: filepath.Join(t.TempDir(), "disk")}
	ct, err := b.StartContainer(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	// systemd ignores the signal until it has set up its handlers: ask
	// again until it goes.
	deadline := time.Now().Add(time.Minute)
	for ct.Alive() && time.Now().Before(deadline) {
		_ = syscall.Kill(ct.PID, syscall.Signal(unixSIGRTMIN+4))
		time.Sleep(500 * time.Millisecond)
	}
	if ct.Alive() {
		t.Fatal("the container did not power off")
	}
	again, err := b.StartContainer(ctx, spec)
	if err != nil {
		t.Fatalf("start after a power-off: %v", err)
	}
	if err := b.StopContainer(ctx, 204); err != nil {
		t.Fatal(err)
	}
	assertContainerGone(t, b, again, again.PID)
}

// unixSIGRTMIN is Linux's first real-time signal as glibc numbers it
// (34: the kernel's 32 and 33 are taken by the C library).
const unixSIGRTMIN = 34

// procStatus is the first field of a line of /proc/<pid>/status ("Uid":
// the real uid).
func procStatus(t *testing.T, pid int, key string) string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			return strings.Fields(v)[0]
		}
	}
	t.Fatalf("no %s line for pid %d", key, pid)
	return ""
}

// assertContainerGone checks that nothing of a stopped container is left.
func assertContainerGone(t *testing.T, b *Bed, ct *Container, pid int) {
	t.Helper()
	if !exited(pid) {
		t.Errorf("the container's init %d is still there", pid)
	}
	if ct.Alive() {
		t.Error("the container's monitor still runs")
	}
	if out, _ := output(context.Background(), "ip", "-n", b.NodeNS(), "-o", "link"); ct.Veth != "" && strings.Contains(string(out), ct.Veth) {
		t.Errorf("veth %s left on the node", ct.Veth)
	}
	for _, d := range b.ctCgroupDirs(ct.VMID) {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left (%v)", d, err)
		}
	}
	if _, err := os.Stat(ct.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lxc directory %s left (%v)", ct.Dir, err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), ct.Dir) {
		t.Errorf("a mount of %s is left in the host's namespace", ct.Dir)
	}
	if _, ok := b.Container(ct.VMID); ok {
		t.Error("the bed still lists the container")
	}
}

// TestContainerSweptWithBed: a container nobody stopped (a test that
// died) goes with its bed: Close kills its init and removes its cgroups,
// though its processes are in no namespace the bed names.
func TestContainerSweptWithBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, rootfs := ctBed(ctx, t)
	ct, err := b.StartContainer(ctx, ContainerSpec{VMID: 203, Rootfs: rootfs, Disk: filepath.Join(t.TempDir(), "disk")})
	if err != nil {
		t.Fatal(err)
	}
	dirs := b.ctCgroupDirs(203)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if !exited(ct.PID) {
		t.Errorf("the container's init %d outlived its bed", ct.PID)
	}
	for _, d := range append(dirs, filepath.Join(cgroupRoot, allHierarchies()[0], b.CgroupParent())) {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s outlived the bed (%v)", d, err)
		}
	}
}

// exited reports whether pid has exited (gone, or a zombie nobody reaped
// yet: a killed container's init is reparented to the host's init), within
// a minute (a loaded machine is slow to tear a container down).
func exited(pid int) bool {
	for range 3000 {
		if procZombie(pid) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// TestStartContainerRefusesOverlayPaths: a directory whose path has a
// ',' or ':' cannot be an overlay layer (the mount options separate them
// with those): refused before anything is made.
func TestStartContainerRefusesOverlayPaths(t *testing.T) {
	b := &Bed{dir: "/run/pve-inspect-testbed/x", cts: map[int]*Container{}, guests: map[int]*Guest{}}
	for _, s := range []ContainerSpec{
		{VMID: 100, Rootfs: "/cache/root,upperdir=/", Disk: "/d"},
		{VMID: 100, Rootfs: "/cache/root", Disk: "/tmp/a:b"},
	} {
		if _, err := b.StartContainer(context.Background(), s); err == nil || !strings.Contains(err.Error(), "overlay's options") {
			t.Errorf("%+v: %v", s, err)
		}
	}
}
