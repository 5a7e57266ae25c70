// Package kvm builds Proxmox VE nodes as nested VMs in a local KVM host's
// libvirt (an Ubuntu 24.04 or Debian machine), the second target of
// DESIGN.md section 9.
//
// A node is a libvirt domain, so virsh, virt-manager and Cockpit see it and
// libvirt brings it back after a host reboot (autostart is on by default).
// pve-bootstrap talks to libvirtd over its RPC protocol in pure Go
// (go-libvirt; builds stay CGO_ENABLED=0) with typed XML (libvirtxml), and
// keeps only what is its own: the verified image, the seed and the recipe.
//
//   - Disk: a qcow2 overlay volume in a directory storage pool (pve-nested,
//     created when missing) on top of the Debian 13 cloud image, verified
//     against Debian's SHA512SUMS before use and uploaded into the pool under
//     a name carrying its digest, so a different image never takes its place;
//     a volume already there is read back and hashed before a node uses it.
//   - Seed: a NoCloud ISO labelled "cidata" built in Go (go-diskfs, Rock
//     Ridge names), uploaded as a raw volume. It carries the same user-data
//     as the EC2 target, so the node provisions itself with
//     `pve-bootstrap node apply`.
//   - Network: a virtio NIC on the NAT network pve-nested (created when
//     missing, autostarted), with a DHCP reservation from the lower half of
//     its subnet so the node keeps its address; leases come from the upper
//     half. Any other existing libvirt network with DHCP may be named
//     instead.
//   - CPU: host-passthrough so the node can run its own guests; nested
//     virtualization is checked first from
//     /sys/module/kvm_{intel,amd}/parameters/nested and reported with the
//     fix (not for a remote URI). --accel tcg makes a domain of type qemu
//     (emulated, slow).
//   - Console: the serial port is a pty (`virsh console`) whose output is
//     also logged to a file.
//   - Tag: an element in the domain's metadata (MetadataURI) carrying the
//     instance id, network, address and MAC; list shows only tagged domains
//     and every verb refuses a domain without the tag.
//
// Create checks its input (name free, network known, nested virtualization)
// before it makes anything, and takes back what it made when a later step
// fails. Clone copies a stopped node's disk into an independent volume and
// gives it a fresh seed with a new instance id, so cloud-init runs the
// recipe again and the recipe's per-instance step makes fresh secrets.
//
// Files, one per libvirt object: libvirt.go (the connection: Config,
// Manager, Dial, errors, undo), node.go (the domains: Create, Get, List,
// Start, Stop, Delete), network.go (the NAT network and its DHCP
// reservations), storage.go (the pool and its volumes), clone.go; the XML
// they send is built in domain.go, the seed in seed.go, the image fetched
// in image.go.
package kvm
