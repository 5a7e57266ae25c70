// Package kvm builds Proxmox VE nodes as nested VMs on a local KVM host (an
// Ubuntu 24.04 or Debian machine), the second target of DESIGN.md section 9.
//
// A node is a directory under the state directory holding a qcow2 overlay
// on a Debian 13 cloud image (verified against Debian's SHA512SUMS before
// use), a NoCloud seed ISO labelled "cidata" built in Go (go-diskfs, with
// Rock Ridge names so cloud-init sees "user-data" and "meta-data"), the QEMU
// pid file, a QMP socket, the serial log and vm.json. The seed carries the
// same user-data as the EC2 target, so the node provisions itself with
// `pve-bootstrap node apply`.
//
// QEMU runs with KVM and the host's CPU model so the node can run its own
// guests; nested virtualization is checked first from
// /sys/module/kvm_{intel,amd}/parameters/nested and reported with the fix
// when it is off. Networking is QEMU user-mode with host forwards for the
// Proxmox API (8006) and the sandbox API, bound to loopback by default.
//
// Clone copies a stopped node's disk into an independent image and gives it
// a fresh seed with a new instance id, so cloud-init runs the recipe again
// and the recipe's per-instance step makes fresh secrets.
package kvm
