// Package testvm is the node in a box of DESIGN.md section 8: a Proxmox-like
// node built from network namespaces, bridges, real dnsmasq and real qemu-ga
// guests, and real unprivileged LXC containers (Debian's lxc, root inside
// mapped to uid 100000 outside; container.go says how they run on a node
// that is a network namespace). Only tests and the demo import it.
package testvm
