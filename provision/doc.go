// Package provision holds the resumable steps that turn Debian 13 into a
// Proxmox VE 9 node with pve-inspectd installed (DESIGN.md section 9).
package provision
