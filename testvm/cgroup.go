package testvm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A guest lives in the cgroup a Proxmox VM lives in: qemu-server starts
// every VM in the systemd scope qemu.slice/<vmid>.scope
// (PVE::QemuServer::vm_start_nolock through PVE::Systemd::enter_systemd_scope,
// see pveemu/FIDELITY.md), so the daemon's health monitor reads the same
// files on a node and in the bed. The bed's scopes sit under a subtree of
// its own in every hierarchy (CgroupParent), so beds run side by side.
// Hosts with the unified (v2) tree get it there; hybrid hosts (v1 memory,
// cpu, cpuacct and blkio beside the unified tree) get a scope in each.
//
// CPU: every VM scope has the same weight (qemu-server vm_start_nolock sets
// CPUWeight, or CPUShares on v1, from cpuunits, default 100 or 1024), all
// of them sit in one qemu.slice beside the host's own services, and a
// guest's code runs on its vCPU threads only (sockets x cores, or vcpus),
// at most cpulimit CPUs when set (CPUQuota). The bed's scope gets the
// default weight and a quota of the VM's CPUs, its qemu.slice one weight
// against the host's processes.

// cgroupRoot is where the cgroup trees are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// CgroupRoot is where the bed's cgroup trees are mounted (what
// sandbox.NodeReader.CgroupRoot takes).
func (b *Bed) CgroupRoot() string { return cgroupRoot }

// CgroupParent is the bed's subtree above qemu.slice in every hierarchy
// (sandbox.NodeReader.Parent).
func (b *Bed) CgroupParent() string { return "pvei-bed-" + b.name }

// cgroupHierarchies lists the hierarchies a guest's scope is made in:
// "" for a pure v2 host; the unified tree and the v1 controllers the
// health monitor reads on a hybrid one.
func cgroupHierarchies() []string {
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		return []string{""}
	}
	var out []string
	for _, h := range []string{"unified", "memory", "cpu", "cpuacct", "blkio"} {
		if _, err := os.Stat(filepath.Join(cgroupRoot, h, "cgroup.procs")); err == nil {
			out = append(out, h)
		}
	}
	return out
}

// scopeDirs returns vmid's scope directory in every hierarchy.
func (b *Bed) scopeDirs(vmid int) []string {
	var out []string
	for _, h := range cgroupHierarchies() {
		out = append(out, filepath.Join(cgroupRoot, h, b.CgroupParent(), "qemu.slice", strconv.Itoa(vmid)+".scope"))
	}
	return out
}

// cfsPeriod is the CFS period the bed's quotas are set against (the
// kernel's default, 100 ms).
const cfsPeriod = 100000

// makeScope creates vmid's scopes and, when memMiB > 0, caps their memory
// at the VM's RAM (what a VM's own kernel has; the guest's OOM kills are
// then counted in the scope); when cpus > 0 it caps their CPU time at cpus
// CPUs (what a VM's vCPU threads can use). It returns the cgroup.procs
// files the guest's first process joins before it execs anything.
func (b *Bed) makeScope(vmid, memMiB int, cpus float64) ([]string, error) {
	var procs []string
	for _, d := range b.scopeDirs(vmid) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup scope: %w", err)
		}
		enableControllers(filepath.Dir(filepath.Dir(d)), filepath.Dir(d))
		procs = append(procs, filepath.Join(d, "cgroup.procs"))
		var limits [][2]string
		if memMiB > 0 {
			limit := strconv.Itoa(memMiB << 20)
			limits = append(limits, [2]string{"memory.max", limit}, [2]string{"memory.limit_in_bytes", limit})
		}
		if cpus > 0 {
			quota := strconv.Itoa(int(cpus * cfsPeriod))
			limits = append(limits, [2]string{"cpu.max", quota + " " + strconv.Itoa(cfsPeriod)},
				[2]string{"cpu.cfs_period_us", strconv.Itoa(cfsPeriod)}, [2]string{"cpu.cfs_quota_us", quota})
		}
		for _, l := range limits {
			p := filepath.Join(d, l[0])
			if _, err := os.Stat(p); err == nil {
				if err := os.WriteFile(p, []byte(l[1]), 0o644); err != nil {
					return nil, fmt.Errorf("cgroup scope: %s: %w", l[0], err)
				}
			}
		}
	}
	return procs, nil
}

// enableControllers lets the children of the unified tree's dirs (the
// bed's parent and its qemu.slice) have memory and cpu files, where the
// host's root delegates those controllers; elsewhere (v1 hierarchies, a
// host without them) it changes nothing and the scope gets no such cap.
func enableControllers(dirs ...string) {
	for _, d := range dirs {
		f := filepath.Join(d, "cgroup.subtree_control")
		if _, err := os.Stat(f); err != nil {
			continue
		}
		for _, c := range []string{"+memory", "+cpu"} {
			_ = os.WriteFile(f, []byte(c), 0o644)
		}
	}
}

// joinScope is the shell prefix that moves the guest's first process into
// its scopes before it execs the guest.
func joinScope(procs []string) string {
	var b strings.Builder
	for _, p := range procs {
		fmt.Fprintf(&b, "echo $$ > '%s' && ", p)
	}
	return b.String() + `exec "$@"`
}

// removeScope removes vmid's scopes once the guest's processes are gone
// (a cgroup with processes cannot be removed: kill what is left first).
func (b *Bed) removeScope(vmid int) error {
	var errs []error
	for _, d := range b.scopeDirs(vmid) {
		if err := removeCgroup(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroup kills what is left in cgroup dir and removes it, retrying
// while the kernel finishes the kills and their parents reap them (a
// killed process stays in its cgroup until it is reaped, which on a
// loaded machine took longer than 2 s).
func removeCgroup(dir string) error {
	var err error
	for range 750 { // 15 s
		if b, rerr := os.ReadFile(filepath.Join(dir, "cgroup.procs")); rerr == nil {
			for _, p := range strings.Fields(string(b)) {
				if pid, perr := strconv.Atoi(p); perr == nil && pid != os.Getpid() {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		err = os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", dir, err)
}

// allHierarchies lists every cgroup hierarchy mounted: "" for a pure v2
// host; on a hybrid one the unified tree and every v1 hierarchy (lxc
// makes a container's cgroups in each of them).
func allHierarchies() []string {
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		return []string{""}
	}
	ents, _ := os.ReadDir(cgroupRoot)
	var out []string
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(cgroupRoot, e.Name(), "cgroup.procs")); err == nil {
			out = append(out, e.Name())
		}
	}
	return out
}

// removeCgroupTree removes cgroup dir and every cgroup below it, the
// deepest first, killing what runs in them (removeCgroup). A missing dir
// is no error.
func removeCgroupTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove cgroup tree %s: %w", dir, err)
	}
	var errs []error
	for _, e := range ents {
		if e.IsDir() {
			if err := removeCgroupTree(filepath.Join(dir, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := removeCgroup(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// sweepCgroups removes the bed's cgroup subtree (the guests' scopes, the
// containers' and their monitors' cgroups, and their parents) in every
// hierarchy, killing what still runs in it.
func sweepCgroups(name string) error {
	// a container frozen when its owner died (a snapshot's freeze) is
	// thawed first, in every hierarchy: its processes cannot die frozen,
	// and no cgroup of theirs could be removed
	for _, h := range allHierarchies() {
		thawTree(filepath.Join(cgroupRoot, h, "pvei-bed-"+name))
	}
	var errs []error
	for _, h := range allHierarchies() {
		if err := removeCgroupTree(filepath.Join(cgroupRoot, h, "pvei-bed-"+name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// thawTree thaws cgroup dir and every cgroup below it: freezer.state
// THAWED where the v1 freezer controls it, cgroup.freeze 0 in the unified
// tree (what exists of them; errors are the sweep's to meet).
func thawTree(dir string) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		for file, val := range map[string]string{"freezer.state": "THAWED", "cgroup.freeze": "0"} {
			if f, err := os.OpenFile(filepath.Join(p, file), os.O_WRONLY, 0); err == nil {
				_, _ = f.WriteString(val)
				_ = f.Close()
			}
		}
		return nil
	})
}

// sweepOrphanCgroups removes the cgroup subtrees of beds whose names
// match pattern and whose node namespace (in netnsDir) is gone: swept by a
// build that did not know of cgroups, or removed by hand. A live bed has
// its node namespace from before its first guest (and scope) to its
// sweep, wherever its state directory is.
func sweepOrphanCgroups(netnsDir, pattern string) error {
	var errs []error
	for _, h := range allHierarchies() {
		dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, h, "pvei-bed-"+pattern))
		for _, d := range dirs {
			name := strings.TrimPrefix(filepath.Base(d), "pvei-bed-")
			if _, err := os.Stat(filepath.Join(netnsDir, name+"-node")); !errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err := sweepCgroups(name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// NodeNetSys is a sysfs mounted from inside the node namespace: its
// class/net holds the node's links, the guests' tap<vmid>i0 among them
// (sandbox.NodeReader.NetRoot is NodeNetSys()+"/class/net"). Mounted on
// first use, unmounted by Close.
func (b *Bed) NodeNetSys(ctx context.Context) (string, error) {
	dir := filepath.Join(b.dir, "node-sys")
	if _, err := os.Stat(filepath.Join(dir, "class", "net")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Read-only per mount, never per superblock: the node namespace has
	// one sysfs superblock, which the bed's containers mount too (their
	// lxc-start's /sys), and a read-only superblock there makes the
	// kernel refuse each container its own sysfs (mount_too_revealing
	// finds no writable instance): their start fails "Failed to mount
	// sysfs".
	if err := run(ctx, "nsenter", "--net=/run/netns/"+b.NodeNS(), "mount", "-t", "sysfs", "-o", "nosuid,nodev,noexec", "sysfs", dir); err != nil {
		return "", fmt.Errorf("testvm: node sysfs: %w", err)
	}
	if err := run(ctx, "mount", "-o", "remount,bind,ro,nosuid,nodev,noexec", dir); err != nil {
		unmountNodeSys(b.dir)
		return "", fmt.Errorf("testvm: node sysfs read-only: %w", err)
	}
	return dir, nil
}

// unmountNodeSys unmounts NodeNetSys's mount in dir, if any.
func unmountNodeSys(dir string) {
	p := filepath.Join(dir, "node-sys")
	if _, err := os.Stat(filepath.Join(p, "class")); err == nil {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}

// ContainerCgroupsOutsideSys is the parent of the bed's containers' cgroup
// v2 directories (ContainerCgroupV2 without the vmid) seen through a bind
// mount of the cgroup v2 tree outside /sys (in the bed's directory), for
// a process started with `ip netns exec`, which mounts a fresh sysfs and
// with it hides /sys/fs/cgroup (the demo's daemon: [api]
// container_cgroups). Bound on first use, unmounted by Close.
func (b *Bed) ContainerCgroupsOutsideSys(ctx context.Context) (string, error) {
	src := filepath.Dir(b.ContainerCgroupV2(0))
	rel, err := filepath.Rel(cgroupV2Root(), src)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(b.dir, cgroupBind)
	if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
		if err := run(ctx, "mount", "--bind", cgroupV2Root(), dir); err != nil {
			return "", fmt.Errorf("testvm: bind the cgroup v2 tree: %w", err)
		}
	}
	return filepath.Join(dir, rel), nil
}

// cgroupBind is ContainerCgroupsOutsideSys's mount point in a bed's
// directory.
const cgroupBind = "cgroup2"

// unmountCgroupBind unmounts ContainerCgroupsOutsideSys's bind in dir, if
// any. An error means the host's cgroup tree may still be under dir,
// which then must not be removed.
func unmountCgroupBind(dir string) error {
	p := filepath.Join(dir, cgroupBind)
	if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err != nil {
		return nil
	}
	if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("testvm: unmount %s: %w (the bed's directory is left)", p, err)
	}
	return nil
}
