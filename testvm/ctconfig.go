package testvm

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// lxcHost is what a container's lxc configuration takes from the host.
type lxcHost struct {
	cgroupParent string // the bed's cgroup subtree
	dir          string // the container's lxc directory
	appArmor     bool   // AppArmor is enabled
	cgroupV2     bool   // the memory and cpu controllers are cgroup v2's
	bridgeMTU    int    // net0's bridge's MTU
}

// lxcConfigDir is where Debian's lxc keeps the configurations
// pve-container includes.
const lxcConfigDir = "/usr/share/lxc/config"

// lxcConfig is the lxc configuration of an unprivileged container, line
// for line what pve-container's update_lxc_config writes for one (LXC.pm;
// lxc 4 or later), but for the differences container.go lists: the
// cgroup directories under the bed's parent, net0 attached by lxc
// (lxc.net.0.link) instead of the lxcnetaddbr hook, AppArmor only where
// the host has it, the v1 cap keys on a hybrid host, and a console log
// for the bed's errors.
func lxcConfig(s ContainerSpec, h lxcHost) string {
	var b strings.Builder
	line := func(k, v string) { fmt.Fprintf(&b, "%s = %s\n", k, v) }
	line("lxc.cgroup.relative", "0")
	line("lxc.cgroup.dir.monitor", h.cgroupParent+"/lxc.monitor/"+strconv.Itoa(s.VMID))
	line("lxc.cgroup.dir.container", h.cgroupParent+"/lxc/"+strconv.Itoa(s.VMID))
	line("lxc.cgroup.dir.container.inner", "ns")
	line("lxc.arch", "amd64")
	// ostype debian: debian.common.conf where the lxc package has one
	// (lxc-pve does), else common.conf; then the userns include.
	inc := filepath.Join(lxcConfigDir, "debian.common.conf")
	if _, err := os.Stat(inc); err != nil {
		inc = filepath.Join(lxcConfigDir, "common.conf")
	}
	line("lxc.include", inc)
	line("lxc.include", filepath.Join(lxcConfigDir, "userns.conf"))
	line("lxc.seccomp.profile", filepath.Join(h.dir, "rules.seccomp"))
	switch {
	case h.appArmor:
		// make_apparmor_config without fuse.
		line("lxc.apparmor.profile", "generated")
		line("lxc.apparmor.raw", "allow mqueue,")
		if s.Features.Nesting {
			line("lxc.apparmor.allow_nesting", "1")
			line("lxc.apparmor.raw", "allow userns,")
		} else {
			line("lxc.apparmor.raw", "deny mount -> /proc/,")
			line("lxc.apparmor.raw", "deny mount -> /sys/,")
		}
	default:
		b.WriteString("# pve-inspect bed: no AppArmor on this host (no /sys/kernel/security/apparmor),\n" +
			"# so none of the profiles pve-container has lxc generate can be loaded.\n")
		line("lxc.apparmor.profile", "unconfined")
		if s.Features.Nesting {
			// lxc mounts its nesting helpers whatever the LSM
			line("lxc.apparmor.allow_nesting", "1")
		}
	}
	line("lxc.mount.auto", "sys:mixed")
	line("lxc.monitor.unshare", "1")
	if len(s.IDMap) > 0 {
		for _, m := range s.IDMap {
			line("lxc.idmap", m)
		}
	} else {
		line("lxc.idmap", "u 0 "+strconv.Itoa(CTIDOffset)+" 65536")
		line("lxc.idmap", "g 0 "+strconv.Itoa(CTIDOffset)+" 65536")
	}
	// console: 1 (the default): no lxc.console.path line; the bed logs it.
	line("lxc.console.logfile", filepath.Join(h.dir, "console.log"))
	line("lxc.tty.max", "2")
	line("lxc.environment", "TERM=linux")
	uts := s.Hostname
	if uts == "" {
		uts = "CT" + strconv.Itoa(s.VMID)
	}
	line("lxc.uts.name", uts)
	mem := s.MemoryMiB
	if mem <= 0 {
		mem = 512
	}
	if h.cgroupV2 {
		line("lxc.cgroup2.memory.max", strconv.Itoa(mem<<20))
		line("lxc.cgroup2.memory.high", strconv.Itoa(memoryHigh(mem)))
		line("lxc.cgroup2.memory.swap.max", "0")
		if s.CPUs > 0 {
			line("lxc.cgroup2.cpu.max", strconv.Itoa(int(cfsPeriod*s.CPUs))+" "+strconv.Itoa(cfsPeriod))
		}
	} else {
		line("lxc.cgroup.memory.limit_in_bytes", strconv.Itoa(mem<<20))
		if s.CPUs > 0 {
			line("lxc.cgroup.cpu.cfs_period_us", strconv.Itoa(cfsPeriod))
			line("lxc.cgroup.cpu.cfs_quota_us", strconv.Itoa(int(cfsPeriod*s.CPUs)))
		}
	}
	line("lxc.rootfs.path", filepath.Join(h.dir, "rootfs"))
	if n := s.Net; n != nil {
		line("lxc.net.0.type", "veth")
		line("lxc.net.0.veth.pair", "veth"+strconv.Itoa(s.VMID)+"i0")
		line("lxc.net.0.hwaddr", strings.ToUpper(n.MAC.String()))
		line("lxc.net.0.name", n.Name)
		line("lxc.net.0.mtu", strconv.Itoa(h.bridgeMTU))
		line("lxc.net.0.link", n.Bridge)
	}
	return b.String()
}

// memoryHigh is pve-container's memory.high for mib MiB of memory
// (LXC/Config.pm calculate_memory_constraints).
func memoryHigh(mib int) int {
	if mib >= 16*1024 {
		return (mib - 128) << 20
	}
	return mib * 1024 * 1016
}

// ctSeccompExtra are the rules pve-container adds to lxc's common seccomp
// profile for an unprivileged container without the keyctl or mknod
// features (LXC.pm make_seccomp_config): btrfs ioctls EPERM, AF_ALG
// sockets EAFNOSUPPORT, and (ctSeccompKeyctl) keyctl ENOSYS.
const ctSeccompExtra = "ioctl errno 1 [1,0x9400,SCMP_CMP_MASKED_EQ,0xff00]\n" +
	"socket errno 97 [0,38,SCMP_CMP_EQ]\n"

// ctSeccompKeyctl is the keyctl rule, which the keyctl feature drops.
const ctSeccompKeyctl = "keyctl errno 38\n"

// ctSeccompRules is the container's rules.seccomp: lxc's common.seccomp
// and ctSeccompExtra, with the keyctl rule unless f has keyctl.
func ctSeccompRules(f ContainerFeatures) (string, error) {
	common, err := os.ReadFile(filepath.Join(lxcConfigDir, "common.seccomp"))
	if err != nil {
		return "", fmt.Errorf("seccomp: %w", err)
	}
	rules := string(common) + ctSeccompExtra
	if !f.Keyctl {
		rules += ctSeccompKeyctl
	}
	return rules, nil
}

// appArmorEnabled reports whether the host has AppArmor enabled.
func appArmorEnabled() bool {
	_, err := os.Stat("/sys/kernel/security/apparmor")
	return err == nil
}

// onlyV2 reports whether the host has the unified cgroup tree only.
func onlyV2() bool {
	h := cgroupHierarchies()
	return len(h) == 1 && h[0] == ""
}

// setupFile is a file pve-container's Setup writes into a container's
// root before its start.
type setupFile struct {
	path string // relative to the root
	data string
}

// ctSetupFiles are the files pve-container's pre-start hook writes for a
// Debian container (Setup/Base.pm pre_start_hook, set_hostname;
// Setup/Debian.pm setup_network, IPv4 only): /fastboot, the interfaces
// file, /etc/hostname. Not written: /etc/hosts, /etc/resolv.conf (the
// DHCP client writes it) and the timezone.
func ctSetupFiles(s ContainerSpec) []setupFile {
	files := []setupFile{{"fastboot", ""}}
	if n := s.Net; n != nil {
		var b strings.Builder
		b.WriteString("auto lo\niface lo inet loopback\niface lo inet6 loopback\n\n")
		switch n.IP {
		case "":
		case "dhcp", "manual":
			fmt.Fprintf(&b, "auto %s\niface %s inet %s\n\n", n.Name, n.Name, n.IP)
		default:
			fmt.Fprintf(&b, "auto %s\niface %s inet static\n\taddress %s\n", n.Name, n.Name, n.IP)
			if n.Gateway.IsValid() {
				fmt.Fprintf(&b, "\tgateway %s\n", n.Gateway)
			}
			b.WriteString("\n")
		}
		files = append(files, setupFile{"etc/network/interfaces", b.String()})
	}
	host := s.Hostname
	if host == "" {
		host = "localhost"
	}
	host, _, _ = strings.Cut(host, ".")
	return append(files, setupFile{"etc/hostname", host + "\n"})
}

// resolveBeneath makes every lookup stay below the directory it starts
// from and follow no symbolic link: the container owns what is in its
// volume, and a link it planted must not send the bed's writes, made as
// the host's root, anywhere else.
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// writeBeneath writes data to rel below upper (a container's overlay upper
// directory) as a file of the container's root, making the missing
// directories on the way with the owner and mode they have in lower (the
// base root; the container's root and 0755 where lower has none).
func writeBeneath(upper, lower, rel string, data string) error {
	dfd, err := unix.Open(upper, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	parts := strings.Split(filepath.Clean(rel), "/")
	for i, p := range parts[:len(parts)-1] {
		next, err := unix.Openat2(dfd, p, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveBeneath})
		if errors.Is(err, unix.ENOENT) {
			uid, gid, mode := ownerIn(lower, filepath.Join(parts[:i+1]...), 0o755)
			if err := unix.Mkdirat(dfd, p, mode); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(dfd)
				return err
			}
			if err := unix.Fchownat(dfd, p, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				unix.Close(dfd)
				return err
			}
			next, err = unix.Openat2(dfd, p, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveBeneath})
		}
		unix.Close(dfd)
		if err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(parts[:i+1]...), err)
		}
		dfd = next
	}
	defer unix.Close(dfd)
	name := parts[len(parts)-1]
	uid, gid, mode := ownerIn(lower, rel, 0o644)
	fd, err := unix.Openat2(dfd, name, &unix.OpenHow{Flags: unix.O_WRONLY | unix.O_CREAT | unix.O_TRUNC | unix.O_NOFOLLOW | unix.O_CLOEXEC, Mode: uint64(mode), Resolve: resolveBeneath})
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if err := f.Chown(uid, gid); err != nil {
		return err
	}
	if _, err := f.WriteString(data); err != nil {
		return err
	}
	return f.Close()
}

// ownerIn is the owner, group and permission bits of rel in root, or the
// container's root and def when root has no such file.
func ownerIn(root, rel string, def uint32) (uid, gid int, mode uint32) {
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, rel), &st); err != nil {
		return CTIDOffset, CTIDOffset, def
	}
	return int(st.Uid), int(st.Gid), st.Mode & 0o7777
}

// mkdirLike makes dir (if missing) with the owner and mode of like.
func mkdirLike(dir, like string) error {
	var st unix.Stat_t
	if err := unix.Stat(like, &st); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, os.FileMode(st.Mode&0o777)); err != nil {
		return err
	}
	if err := os.Chown(dir, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	return os.Chmod(dir, os.FileMode(st.Mode&0o777))
}

// ctNetValid reports whether a net0 ip value is one Setup handles.
func ctNetValid(ip string) error {
	switch ip {
	case "", "dhcp", "manual":
		return nil
	}
	p, err := netip.ParsePrefix(ip)
	if err != nil || !p.Addr().Is4() {
		return fmt.Errorf("ip %q: want dhcp, manual or an IPv4 CIDR", ip)
	}
	return nil
}
