// Package sysbox boots a Debian container with systemd as PID 1, for tests
// that need real systemd and real D-Bus (DESIGN.md section 8, "systemd
// container"): the fail-deadly halt, the packaged units, the watchdog.
//
// # Root file system
//
// EnsureRootfs builds a Debian root with
//
//	debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus[,extra] SUITE DIR MIRROR
//
// once and caches it under CacheDir (default /var/cache/pve-inspect-testbed)
// as rootfs-<hash>, where the hash covers the whole recipe (suite, variant,
// package list and the post-build steps' version): change the recipe and the
// next run builds a new root. A build runs in a temporary directory that is
// renamed into place only when complete, under an flock so concurrent test
// processes build it once. The mirror is read from the machine's apt sources
// (/etc/apt/sources.list.d/*.sources, /etc/apt/sources.list), falling back to
// http://deb.debian.org/debian. A build takes about 50 s here.
//
// EnsureShiftedRootfs caches a copy of a root with every owner (and POSIX
// ACL entry) shifted by an offset: the root of an unprivileged container
// whose idmap maps 0 to that offset (testvm's containers).
//
// # Containers
//
// Start gives each container an overlay of the cached root (lower) with a
// per-container upper directory, so nothing a test does reaches the cache.
// The boot is equivalent to
//
//	unshare --pid --fork --mount --uts --ipc --net
//	  mount --make-rprivate /; mount overlay on ROOT
//	  mount proc ROOT/proc; mount sysfs ROOT/sys; mount tmpfs ROOT/run
//	  unshare --cgroup; mount cgroup2 ROOT/sys/fs/cgroup
//	  chroot ROOT env container=other /lib/systemd/systemd --system
//
// done with clone flags from Go, so the process Start creates is the
// container's PID 1 (Container.PID is its host pid). One deviation from a
// plain `--rbind /sys/fs/cgroup`: the container is cloned straight into a
// cgroup of its own (<cgroup2 mount>/pve-inspect-sysbox/<name>) and gets a
// cgroup namespace with a fresh cgroup2 mount rooted there. With the rbind,
// two containers running at once (parallel test runs) would both manage the
// host's top-level system.slice; with the namespace each systemd owns only
// its subtree, and cgroup.kill on that subtree ends every process of the
// container.
//
// Exec runs a command inside with nsenter (mount, uts, ipc, net and pid
// namespaces, and the container's root directory). Restart is a power cut and
// boot: PID 1 gets SIGKILL, which ends the pid namespace, the mount namespace
// and with it the overlay and the /run tmpfs; the next boot reuses the upper
// directory, so files persist and anything under /run (runtime masks, for
// one) is gone. Close kills the container and removes its directory and
// cgroup.
//
// # Clean-up
//
// Every container has a directory under CacheDir/containers and a lock file
// beside it, held (flock) by the test process for the container's life. A
// later Start sweeps containers whose lock is free: their owner died without
// Close (a killed `go test`). The sweep kills through the stale container's
// own cgroup and removes only its own directory, so it never touches another
// live run's container.
//
// Only tests and the demo import this package; it needs root.
package sysbox
