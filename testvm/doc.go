// Package testvm is the node in a box of DESIGN.md section 8: a Proxmox-like
// node built from network namespaces, bridges, real dnsmasq and real qemu-ga
// guests. Only tests and the demo import it.
package testvm
