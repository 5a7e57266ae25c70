// Package e2e_test runs the sandbox API end to end: against the Proxmox
// emulator (testvm/pveemu) with its fake backend (no root), and on the
// node-in-a-box bed with real qemu-ga guests (root).
package e2e_test
