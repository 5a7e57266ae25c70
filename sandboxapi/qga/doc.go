// Package qga is a client for the QEMU guest agent protocol spoken over the
// unix socket that Proxmox itself uses (/var/run/qemu-server/<vmid>.qga).
// Every byte that arrives on the socket is treated as hostile.
package qga
