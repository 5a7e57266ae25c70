// Package qga is a client for the QEMU guest agent protocol spoken over the
// unix socket that Proxmox itself uses (/var/run/qemu-server/<vmid>.qga).
// Every byte that arrives on the socket is treated as hostile.
//
// # Use
//
//	c := qga.New(qga.Options{})            // one per daemon
//	a := c.Agent("/var/run/qemu-server/101.qga")
//	res, err := a.Exec(ctx, qga.ExecRequest{Argv: []string{"uname", "-a"}, Timeout: time.Minute})
//	err = a.WriteFile(ctx, "/opt/probe", binary, 0o755)
//	n, err := a.ReadFile(ctx, "/etc/os-release", w, 16<<20)
//
// The sandbox engine dials its guests through c.SandboxGuests(): each is a
// Guest (sandboxguest.go), which satisfies sandbox.Guest itself and wraps
// this package's errors with the engine's guest sentinels. A VM whose
// os_type is Windows is dialed through c.WindowsGuests() (WinGuest): what
// follows is the Linux guest's design; windows.go has the Windows one.
//
// # Design decisions
//
// Channel. QEMU serves one client at a time on the socket and Proxmox
// pings it with a 3 s timeout, so the client never holds a connection idle:
// every command sequence is one short connection (a "session"), taken
// under a per-socket mutex that a waiter can abandon through its context;
// different sockets share nothing and run fully in parallel. A session
// starts with 0xFF (which flushes whatever a previous client left in the
// agent's JSON parser; qemu-ga answers it with one parse-error line) and
// guest-sync-delimited with a fresh random id below 100000; everything up
// to the 0xFF that precedes the echoed id is discarded, within bounds.
// Every command then carries a QMP "id" that qemu-ga echoes, so a reply to
// anything else (a stale or invented reply) is detected instead of being
// taken for ours.
//
// Hostile replies. Every read has a stall deadline and every command an
// overall deadline; a reply line is bounded (Options.MaxReplyBytes, sized
// from the largest file chunk) and must be one strict JSON object with
// exactly one of "return" and "error" and our id, with a return value of
// the expected shape. Anything else is a *ProtocolError whose Kind tells
// what happened; the connection is dropped and the next call starts
// afresh. A guest-exec-status reply is streamed and every string in it cut
// to what the request's output limit needs (replycut.go), so on every exec
// path a reply costs what the request asked for, whatever the agent sends;
// output data on a status that has not exited is a protocol error. Every
// reply buffer is taken from a Budget shared by all connections (one per
// daemon: node-wide, Options.Budget), and a buffer that would pass it is
// refused with ErrBudget. Client.BufferedBytes and PeakBufferedBytes
// expose the memory held in reply buffers so tests (and metrics) can check
// that it stays bounded.
// Agent-side failures ({"error": ...}) are *AgentError and match
// ErrNotFound, ErrIsDir and ErrPermission with errors.Is.
//
// Closing. A connection is never abandoned mid-command without closing
// it, and closing one with unread data in its receive queue resets it,
// which makes a unix-listen qemu-ga exit ("error reading channel"). So a
// session that ends with a reply possibly still on its way half-closes
// the socket and discards what arrives for at most DrainTimeout before it
// closes.
//
// Files. guest-file-read and guest-file-write move base64 in JSON, which
// the agent parses at some tens of MB/s, so chunk sizes adapt to the
// measured speed so that one call takes about ChunkTarget (250 ms), between
// 64 KiB and MaxChunk (8 MiB; qemu-ga refuses messages over 64 MiB of JSON
// tokens, i.e. chunks over 48 MiB - 192 bytes). Each chunk is its own
// session, so other clients (Proxmox's pings) interleave between chunks;
// the caller's reader and writer are used outside the per-VM lock, one
// chunk ahead of the agent (pipeline.go): the next chunk is read from the
// caller while the agent writes the current one, and a chunk read from the
// agent goes to the caller while the next is fetched. Writes
// go to a temporary file in the target directory, which is renamed over
// the target (chmod + mv, one guest-exec) only when complete; a missing
// parent directory is created on the first not-found. Handles are closed
// on every path, on a fresh short context when the caller's is gone.
//
// Exec. guest-exec with capture-output keeps the output in the agent's
// memory until the process ends and gives nothing back while it runs, and
// a background child that holds the pipe keeps it open. So the command's
// stdout and stderr go to guest temp files that the client created (and
// holds open) in a root-only directory (Options.GuestTempDir, created 0700
// on first use, so the guest's other users can neither read nor inject
// output) and reads incrementally with guest-file-read: the per-stream
// limit is enforced while reading, output can be streamed while the
// command runs (ExecStream), and the call ends when the command itself
// exits. The command runs under a small POSIX sh wrapper that opens the
// files, unlinks them (the agent's handles keep them alive, so nothing is
// left behind), sets env, user (setpriv) and cwd, and execs the command
// through setsid: the pid guest-exec reports is the command's own, leader
// of a new session and process group, so its exit code or signal comes
// back unchanged and a timeout or cancellation kills the whole tree
// (kill -9 of the group, pkill -9 -s of the session). User data reaches
// the wrapper only as positional parameters, never inside the script;
// arguments that are not valid UTF-8 (JSON strings cannot carry them)
// travel as octal escapes decoded by printf. Stdin up to InlineStdin
// travels in guest-exec's input-data, larger stdin is streamed into a
// guest temp file first. Status is polled at a tenth of the elapsed time,
// clamped to 1..50 ms; while the command runs a poll is one
// guest-exec-status call, its output is read every 100 ms.
//
// Which path an exec takes. Exec picks the cheapest path that gives the
// request's features; every path keeps the timeout, the tree kill and the
// output limit:
//
//   - direct (Exec without stdin, env, cwd or user, argv valid UTF-8,
//     limit under the agent's 16 MiB capture cap; what the sandbox API's
//     collected exec sends by default): one guest-exec with
//     capture-output, tagged: the path is the command itself (looked up
//     by qemu-ga in PATH), and its env is the fixed base environment
//     (BaseEnv: PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:
//     /sbin:/bin, HOME=/root, LANG=C.UTF-8) plus
//     PVE_INSPECT_EXEC=<32 random hex digits>, fresh per exec. qemu-ga
//     gives the child exactly the env list it is sent (not merged with
//     its own) and looks the program up in that list's PATH
//     (G_SPAWN_SEARCH_PATH_FROM_ENVP; qga/commands.c, qmp_guest_exec).
//     Nothing is read from the guest to build it: an earlier version
//     captured the agent's environment with the guest's own
//     /usr/bin/env -0 and cached it per socket path, and the next sandbox
//     on a reused VMID ran with the previous tenant's PATH and BASH_ENV
//     (issue 34). Every other guest-exec the client sends carries BaseEnv
//     too, so no command inherits the agent's own environment.
//     One process is spawned, as for a bare
//     guest-exec; the pid is the command's own, its exit code or signal
//     comes back unchanged. A timeout or cancellation kills every process
//     whose /proc/PID/environ holds the exact tag entry (whole
//     NUL-delimited entries, repeated while new ones appear): background
//     children, children that called setsid themselves and orphans
//     reparented to init, never the agent or a concurrent exec; the
//     command itself is also killed by pid while it is the agent's child.
//     A process that exec'd with a cleared environment or overwrote its
//     initial environment area (setproctitle) escapes: the VM is the
//     security boundary, the timeout is resource management. The command
//     stays in the agent's process group and session: `kill 0` in it
//     (for example `trap 'kill 0' EXIT`) signals qemu-ga and the guest's
//     other commands too (Options.ExecOwnSession avoids it). When
//     guest-exec cannot start the program (not found, not executable;
//     nothing ran), the request runs once more through setsid, so it ends
//     with 127 or 126 and setsid's message like on the other paths. The
//     agent captures the output (flagging what it drops past 16 MiB); the
//     client cuts each stream at the limit and bounds the final reply by
//     the agent's cap for both streams (about 45 MB), not by the limit.
//     The session that starts the command keeps its connection for up to
//     25 ms to poll it, so a quick command costs one connection and one
//     sync. qemu-ga reports the exit only when the output pipes close, so
//     a background process that keeps stdout or stderr open would hold the
//     result: from 100 ms on, at doubling intervals up to 5 s, the client
//     asks the guest whether the command itself is gone, and if so kills
//     the tagged processes that hold one of the agent's pipes; the result
//     (the command's own status) follows at once. Background processes
//     that redirected their output are left running, as on the other
//     paths. With Options.ExecOwnSession (or when the agent could not
//     start the program), the direct path runs
//     /usr/bin/setsid with the command as its arguments instead:
//     util-linux setsid forks only when its caller leads a process group,
//     and qemu-ga's children do not, so it calls setsid() and execs the
//     command (one exec more, about 2.5 ms on the build machine), which
//     leads a new session and group that a timeout kills (pkill -s, kill
//     of the group); background holders of the output in that session
//     and group are killed once the command is gone. A guest without
//     /usr/bin/setsid then gets the wrapper's collected path.
//   - collected through the wrapper (Exec without stdin, when env, cwd,
//     user or a non-UTF-8 argument asks for the wrapper; limit under the
//     cap) skips guest-file-open, which costs qemu-ga a write of its
//     persistent state file each time: the wrapper opens the temp files
//     itself (write ends for the command, separate read ends for itself),
//     unlinks them, runs the command through setsid as its child, and then
//     prints at most limit+1 bytes of each file to its own stdout and
//     stderr, which the agent captures. The tree kill targets the sessions
//     of the wrapper's children; a death by SIGHUP, INT, KILL, PIPE, ALRM
//     or TERM is passed on by the wrapper dying of the same signal, other
//     statuses as exit codes (so a command that exits 137 reads as killed
//     by signal 9). Background children keep the files, not the agent's
//     pipes, so they neither hold the result nor get killed.
//   - streamed (ExecStream, and Exec with stdin or a limit at or above the
//     cap): the wrapper execs the command and the client reads the output
//     files while it runs, as described above.
//
// Limits of the guest side: the tagged direct path needs, for its kills
// and background checks, /bin/sh, GNU grep (-z), ls and tr, and /proc; the setsid
// direct path needs /usr/bin/setsid, and /bin/sh, pkill, pgrep, ls, grep
// and tr; the wrapper needs /bin/sh, setsid, rm and head in the guest
// (pgrep for the collected path's kill), setpriv and id for User, and
// pkill (optional) for the session kill. On the setsid and wrapper paths
// a process that calls setsid itself escapes the tree kill; on the setsid
// direct path, if it also keeps the command's output open, the agent
// never reports the exit and the call ends in an error 30 s after the
// timeout's kill (or when ctx ends); on the tagged path the same holds
// for a process that dropped the tag and keeps the output open.
// Output beyond the limit is not read but still written to the
// (unlinked) guest file until the command ends (wrapper paths). Guest paths for the file commands must be
// valid UTF-8 (they travel as JSON strings).
package qga
