// Package provision holds the resumable steps that turn Debian 13 into a
// Proxmox VE 9 node with pve-inspectd installed (DESIGN.md section 9).
//
// A recipe is data: an ordered list of [Step], each with an id, a read-only
// check ("already done?"), an apply, and a flag saying whether a reboot must
// follow. The [Engine] runs the list:
//
//   - Plan runs only the checks and reports what apply would change.
//   - Apply runs the check of each step, applies the steps that are not done,
//     verifies the check afterwards (an apply that does not converge is an
//     error), and records progress in /var/lib/pve-bootstrap/state.json
//     together with the kernel's boot id. Running Apply a second time runs
//     only checks and changes nothing.
//   - Before a reboot it waits for the dpkg lock to be free and for a clean
//     `dpkg --audit`, installs a systemd oneshot unit that resumes apply after
//     boot, and reboots. The unit is removed when the recipe completes. A
//     resumed apply compares boot ids to tell "rebooted" from "the reboot
//     never happened".
//   - A failed step stops the run with a [*StepError] carrying the step's
//     output and the exact command that resumes.
//
// Every host path goes through a [Root] (a configurable file system root),
// every command through a [Runner], and the primary address comes from an
// [AddrSource] (netlink, never parsed text), so tests run the recipe against a
// fixture tree with a recording runner ([RecordingRunner]).
//
// No step patches Proxmox's own files: debconf answers are preseeded, the
// enterprise repository is switched off with its own deb822 "Enabled: no"
// field, and storage content types are set through pvesm.
//
// Secrets are per instance (cloud-init instance id, or /etc/machine-id): the
// root password is set on the first boot of each instance. The daemon's
// Proxmox API token belongs to the pve-inspectd package (its access setup
// makes a token limited to the daemon's pool, SDN and node); on a clone the
// step drops the inherited token and runs that setup again, and replaces the
// inherited node certificate (pvecm updatecerts --force). The root password is
// only ever handed to the system as a hash (chpasswd -e); the clear value is
// generated in memory and, when configured, handed on stdin to a secret-store
// command; it is never written to disk or logged.
package provision
