// Package halt is the fail-deadly halt of DESIGN.md section 4: when the
// egress lockdown is asked for but cannot be proven in force, the Proxmox
// API daemons (pveproxy.service and pvedaemon.service by default) are
// stopped and runtime-masked over systemd's D-Bus API, and the reason is
// recorded in a state file (/run/pve-inspectd/halted), the journal (slog,
// component=halt) and the metrics pve_inspect_halted{reason},
// pve_inspect_halts_total and pve_inspect_halt_failures_total. SSH is not
// touched. Recover lifts the halt once a cause check says the cause is
// gone; a reboot lifts it too, because a runtime mask and the state file
// live in /run.
//
// # Order and idempotency
//
// Halt records first (state file and metric), so a halt that cannot reach
// systemd is still on record and alerting fires; then it masks (runtime,
// forced), reloads, stops, and finally reads every unit's LoadState and
// ActiveState back: an error unless each is masked and inactive. Masking
// before stopping means nothing (Restart=, a dependency, socket activation)
// can start a unit between the two. A second Halt keeps the first reason and
// time and enforces again, which repairs a partial earlier attempt. Halt
// never refuses a reason: control characters are replaced and the length is
// bounded (the reason is a label value).
//
// A runtime mask lives in /run/systemd/system, which ranks below
// /etc/systemd/system: it overrides units shipped in /usr/lib/systemd/system
// (where Proxmox puts pveproxy and pvedaemon) but not a unit file an
// administrator placed in /etc/systemd/system. The read-back catches that
// case (LoadState stays "loaded") and Halt reports it.
//
// # Which way to systemd (authorization)
//
// The daemon runs as root with a bounded capability set (for example
// CapabilityBoundingSet=CAP_NET_ADMIN CAP_KILL) and NoNewPrivileges=yes, so
// it lacks CAP_SYS_ADMIN. Two ways reach systemd's manager API:
//
//   - the system bus (org.freedesktop.systemd1 through dbus-daemon), where
//     systemd authorizes privileged methods by the caller's credentials or
//     polkit;
//   - systemd's private socket /run/systemd/private (what systemctl uses as
//     root): a direct connection to PID 1, protected by file permissions
//     (srwx------ root), no dbus-daemon, no polkit.
//
// Tested in sysbox containers (Debian bookworm: systemd 252, dbus-daemon
// 1.14; Debian trixie as in Proxmox VE 9: systemd 257, dbus-daemon 1.16;
// no polkit in either; TestHaltTransports, trixie with
// PVE_INSPECT_SYSBOX_SUITE=trixie) with a oneshot unit running
// `pve-inspectd halt` under CapabilityBoundingSet=CAP_NET_ADMIN CAP_KILL,
// NoNewPrivileges=yes, ProtectSystem=strict, PrivateTmp=yes,
// RestrictAddressFamilies=AF_UNIX AF_NETLINK:
//
//   - private socket: works (mask, reload, stop, start all authorized);
//   - system bus: also works, with no polkit installed. Dropping
//     capabilities did not matter there. Our reading (not verified in
//     systemd's source here): dbus-daemon does not hand systemd the
//     caller's capabilities in a form it trusts, so systemd falls back to
//     comparing the caller's uid with its own, and root passes;
//   - system bus with dbus stopped: fails (connection refused), while the
//     private socket still works;
//   - the same unit as User=nobody: the private socket refuses the
//     connection (permission denied), the system bus refuses every call
//     (Permission denied): both checks are real.
//
// Chosen: TransportAuto, the default: the private socket first, the system
// bus only when the private socket cannot be reached. The private socket
// has the fewest moving parts on the fail-deadly path (no dbus-daemon that
// may be hung or restarting, no bus policy, no polkit rules an
// administrator may have added), and root is all it needs. What a unit
// must not do for it: run as another user, hide /run/systemd
// (InaccessiblePaths=), or forbid AF_UNIX (RestrictAddressFamilies=).
// The private socket is systemd's internal interface, not a documented
// stable API; systemctl itself depends on it, and the system bus fallback
// covers a systemd that ever drops it. Not verified here: dbus-broker
// instead of dbus-daemon, and hosts with polkit installed or polkit rules
// (both only concern the fallback).
//
// The state file needs a writable /run/pve-inspectd: with
// ProtectSystem=strict, give the unit RuntimeDirectory=pve-inspectd and
// RuntimeDirectoryPreserve=yes (as the tested unit does) so a stopping unit
// does not delete the record. A halt that cannot write it still stops and
// masks, and reports the error.
//
// # Recover
//
// Recover takes a CauseCheck (injected by the caller, see
// cmd/pve-inspectd/halt.go): while it returns an error Recover refuses with
// a *CauseError and changes nothing. Otherwise it unmasks (runtime),
// reloads, resets each unit's failed state (and with it the start rate
// limit, which repeated halts and recoveries can hit), starts each unit and
// checks it runs, and only then removes the state file. A persistent mask (in /etc) is never lifted.
//
// Each call opens its own connection to systemd and closes it: halts are
// rare, and a connection kept open would not survive a daemon-reexec.
package halt
