// Package ctguest is the guest of an unprivileged LXC container
// (pve-container) for the sandbox engine: it implements sandbox.Guest
// (exec, streamed exec, file read and write, ping) with no agent in the
// container. The daemon runs on the node and enters the container
// itself; everything that runs there is treated as hostile.
//
// # Use
//
//	c := ctguest.New(ctguest.Options{})  // one per daemon; PVE 9 defaults
//	g := c.Guest(101)
//	res, err := g.Exec(ctx, sandbox.GuestExec{Argv: []string{"uname", "-a"}, Timeout: 60})
//	err = g.WriteFile(ctx, "/opt/probe", r, 0o755)
//	n, err := g.ReadFile(ctx, "/etc/os-release", w, 16<<20)
//
// # Design decisions
//
// Entering. Every exec and every file operation is a process in the
// container started by lxc-attach, as Proxmox's own `pct exec` does
// (pve-container src/PVE/CLI/pct.pm, exec; LXC.pm's console command uses
// lxc-attach --clear-env too):
//
//	lxc-attach -P <lxcpath> -n <vmid> --clear-env --elevated-privileges=CGROUP
//	    -v PATH=... -v HOME=/root -v LANG=C.UTF-8 -- /bin/sh -c <script> pve-inspect <params...>
//
// (lxc-attach's -e takes its argument attached: "-e CGROUP", two words,
// runs CGROUP as the command.) lxc-attach enters all of the container's
// namespaces (user, mount, pid, network, UTS, IPC, cgroup) and takes its
// idmap (root inside is 100000 outside), its capability bounding set,
// seccomp filter and LSM profile:
// the process is exactly as strong as the container's own root, never
// more. Nothing of the host crosses: lxc-attach runs with a fixed
// environment of its own (PATH only, not the daemon's), --clear-env
// clears even that inside, and the command's environment is rebuilt from
// scratch by `env -i` (qga.BaseEnv, the same base as the VM agent's, plus the
// request's Env); its working directory is the host's / (lxc-attach keeps
// the caller's cwd when the container has that path) and then the
// request's; the umask is set (022). Descriptors: Go gives lxc-attach
// only its three pipes, but a descriptor the daemon inherited without
// close-on-exec (from its parent, from systemd) would be passed on, and
// lxc-attach passes every descriptor it inherits to the container (it
// closes none; lxc-start checks them, lxc-attach does not): so before
// each start every descriptor above 2 is made close-on-exec
// (close_range CLOSE_RANGE_CLOEXEC; Go opens its own that way already).
// Still inherited from the daemon: rlimits (unless the CT config sets
// lxc.prlimit), nice value and CPU affinity.
//
// Files. ReadFile and WriteFile are scripts of the container's own tools
// (sh, stat, cat, mkdir, chmod, mv) run the same way, their bytes streamed
// through the pipes: every path (symbolic links, /proc/<pid>/root and
// other magic links, mounts) resolves in the container's mount namespace
// with the container's credentials, so a link to a host path finds the
// container's file of that name or nothing. The daemon never opens a path
// under the container's root from the host. (`pct pull` enters only the
// mount namespace and opens the file as host root; `pct push` also enters
// the user namespace; see testvm/pveemu/FIDELITY.md. This package enters
// everything.) A write goes to a temporary file in the target's directory
// renamed over the target (mv -T: a link at the target is replaced) when
// the source ended; on any error the job is killed before its stdin is
// closed, so a cut stream is never taken for a whole one, and the
// temporary file is removed.
//
// Scripts. User data (argv, env, cwd, user, paths) only travels as the
// script's positional parameters, never inside its text. Every script
// first prints a marker line on stdout: lxc-attach reports its own
// failures (container not running) with exit status 1, like any command,
// and the marker tells a script that ran from one that never started
// (ErrGuestUnavailable with lxc-attach's stderr). What a script prints
// before its payload (the marker, a read's size line) is the only
// container output the package parses (preamble.go), bounded and strict.
// User: the wrapper looks the user up in the container (id, getent) and
// runs the command through setpriv (util-linux: --reuid, --regid,
// --init-groups), as the VM agent's wrapper does; lxc-attach's -u/-g take
// numeric ids only and set no groups, HOME or USER. setpriv also stands
// between env and the command (without a user it changes nothing), so a
// program name holding '=' is not taken for an env assignment. A user or
// working directory that cannot be set up ends the script with
// ExitSetupFailed (125) and the reason on stderr; 126 and 127 are the
// shell's. A container whose tools are broken or hostile (a /bin/sh that
// hangs, prints garbage or floods) only spoils its own answers: each call
// stays bounded by its limits, its timeout and its context.
//
// Killing the tree. The guest is not trusted to end what it started: each
// job runs in a cgroup v2 directory of its own, made per call as a child
// of the container's cgroup (lxc/<vmid>, Options.CgroupDir), a sibling of
// the container's delegated inner cgroup (ns, lxc.cgroup.dir.container.
// inner): under the container's limits, outside the part the container's
// root owns. lxc-attach is started into it (clone3 CLONE_INTO_CGROUP,
// SysProcAttr.UseCgroupFD), so there is no moment it runs elsewhere, and
// --elevated-privileges=CGROUP keeps lxc-attach from moving the attached
// process into the container's cgroup: every process of the job, forked,
// double-forked, setsid'd or reparented to the container's init, stays in
// it. The container's root cannot move one out: cgroup v2 migrates a
// process only for a writer of the cgroup.procs of the source's and
// target's common ancestor, which is the container's cgroup directory,
// host root's (checked before each call: owned by uid 0, writable by no
// one else, the inner cgroup present). When the timeout passes or the
// context ends, cgroup.kill SIGKILLs every process in it at once (forks
// racing the kill included); when lxc-attach exits, whatever the command
// left behind is killed the same way. So a command's background
// processes end with it, unlike on a VM (where they keep running): a
// service meant to outlive an exec has to be started through the
// container's init (systemd-run), which the exec's processes can ask
// for, like anything the container runs on its own. The cgroup is then
// removed. Sweep removes exec cgroups a dead daemon left (lxc-attach dies
// with the daemon through its parent-death signal, the container side
// does not).
//
// Output. stdout and stderr are pipes read by one goroutine each, handed
// to the caller's writers from the calling goroutine; each stream is cut
// at its limit (the rest read and dropped, the stream flagged) and a
// read's stdout past its cap ends the job (ErrTooLarge after exactly max
// bytes). stderr that comes before the marker is held back (at most
// 64 KiB): it is lxc-attach's. A process outside the job that holds a
// pipe's write end (the container's root can pass it over a unix socket
// to a process of its own) cannot hold the call: once the job's
// processes are gone, a reader takes only the bytes the pipe holds at
// that moment (FIONREAD) and stops. The timeout and the context are
// watched by a goroutine of their own, so a slow writer of the caller
// does not delay a kill. Every goroutine of a call ends before it
// returns; the one exception is lxc-attach outliving its SIGKILL by
// KillGrace (a process stuck in the kernel), when the call gives up on it
// with an error.
//
// Where it runs. On a PVE 9 node (pure cgroup v2) the container's cgroup
// is /sys/fs/cgroup/lxc/<vmid> and lxc-attach needs no prefix. On the
// test bed the node is a network namespace: lxc's command socket is an
// abstract unix socket of the monitor's network namespace, so
// Options.Prefix is nsenter --net=<node>, and the cgroups are under the
// bed's parent. On a hybrid host (cgroup v1 controllers beside the
// unified tree, the build machines) the exec cgroup is in the unified
// tree only: the job is killed and confined as above, but it stays in the
// daemon's v1 cgroups, so the container's v1 memory and CPU caps do not
// apply to it and /proc/self/cgroup inside names the daemon's v1 cgroups.
package ctguest
