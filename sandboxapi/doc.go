// Package sandboxapi serves the local sandbox API of DESIGN.md section 5:
// sandbox (SDN zone plus VMs) lifecycle and guest I/O over the QEMU guest agent.
//
// Design decisions:
//
//   - The package owns the HTTP surface (Server), the sandbox bookkeeping
//     (Manager: guard, reaper, reconcile, state file) and nothing else. It
//     talks to Proxmox through the small Proxmox interface (implemented with
//     go-proxmox in pveapi), to guests through the Guest interface
//     (implemented by the guest agent client qga, adapted by the
//     wiring) and to the containment probe through Checker.
//   - Ownership: every VM carries two Proxmox tags, the node tag
//     "pvei-n-<node>" and the sandbox tag "pvei-s-<sandbox>", and is placed in
//     the daemon's pool. SDN zones cannot carry tags, so a sandbox's zone id is
//     its sandbox id and its vnets carry both tags in their alias; a zone is
//     only removed when the state file records it or a vnet in it carries both
//     tags. Cleanup never touches an object without both tags of this node.
//   - A sandbox is written to the state file (state "creating") before the
//     first Proxmox object exists, so a crash mid-create is cleaned up on the
//     next start by Reconcile.
//   - Reads from a guest are checked against the cap before the first
//     response byte, so "over the cap" is a distinct error (output-limit)
//     and never a truncated 200: the guest agent client learns the size from
//     the open handle and the bytes stream with it as Content-Length; a Guest
//     that cannot tell the size first is spooled to a temporary file.
//   - Errors are RFC 9457 problem documents whose "type" is a stable short
//     slug (ProblemNotFound, ...); clients branch on it.
package sandboxapi
