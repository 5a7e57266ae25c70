// Package lockdown runs the marker-gated egress lockdown of DESIGN.md section
// 4: event driven, fail closed, and fail deadly (halt) when the lockdown is
// asked for but cannot be proven in force.
//
// # Design
//
// One [Controller] owns all lockdown state in a single goroutine (its Run
// loop). Everything else only wakes that loop: fsnotify events on the
// marker's directory (create, remove, rename over, chmod) and on the
// resolver file's directory, classification changes of the host guard
// (default routes and links), and a periodic re-assert tick as a backstop.
// Wake-ups coalesce: the loop drains every pending event and then reconciles
// once against the state it reads from the file system, never against the
// event that woke it, so a burst of 200 marker flips ends in the final
// state.
//
// A reconcile is idempotent and proceeds in a fixed order:
//
//   - marker present: the guard's lockdown rules take the management set
//     ([Guard.SetLockdown]); with no management (default-route) interface
//     the blanket forward drop goes on ([Guard.SetFailClosed]) and the node
//     halts; the resolver file is backed up once (outside the watched file,
//     under BackupDir, together with a record of whether it existed and its
//     mode and owner) and replaced by a single comment line; the SDN dnsmasq
//     instances get SIGHUP (dnsmasq then drops its upstream servers and
//     answers REFUSED for names it would have forwarded, and clears its
//     cache); the guard's table is verified. Any step that fails is retried
//     once where a retry can help, and otherwise ends in a halt: the lockdown
//     was asked for but cannot be proven in force.
//   - marker absent: the lockdown and the blanket drop go off, the resolver
//     file is restored byte-identical (or removed when it did not exist
//     before), dnsmasq gets SIGHUP, and the backup is deleted: nothing of
//     ours is left behind.
//
// The marker counts as present when it cannot be checked (any error other
// than "does not exist"): the controller fails closed.
//
// # Finding the SDN dnsmasq instances
//
// [ProcSignaler] scans /proc and signals a process only when both hold:
//
//   - its executable is dnsmasq: the base name of /proc/PID/exe (a trailing
//     " (deleted)" from a package upgrade is ignored) equals
//     [DnsmasqMatcher.Exe]; when exe cannot be read (a daemon without
//     CAP_SYS_PTRACE cannot read it for another user's process),
//     /proc/PID/comm is used instead;
//   - its command line (the NUL-separated /proc/PID/cmdline) contains one of
//     [DnsmasqMatcher.CmdlineContains] as a substring of one argument.
//     Proxmox SDN starts its zone instances as dnsmasq@<zone>.service with
//     "--conf-dir=/etc/dnsmasq.d/<zone>"; the defaults are
//     "/etc/dnsmasq.d/" and the resolver file path.
//
// No other process is ever signalled. Sending SIGHUP to a dnsmasq running as
// the dnsmasq user needs CAP_KILL.
//
// # State and latency
//
// After each reconcile the controller publishes a [State] (metrics, and a
// JSON state file read by "pve-inspectd lockdown status"). The
// marker-to-enforced latency is measured from the arrival of the first file
// system event of the batch that showed the marker, to the end of the
// reconcile that proved the lockdown in force.
package lockdown
