// Package sandboxapi serves the local sandbox API of DESIGN.md section 5:
// sandbox (SDN zone plus VMs) lifecycle and guest I/O over the QEMU guest agent.
package sandboxapi
