// Command pve-bootstrap builds a Proxmox VE node, nested on a KVM host or on
// EC2, and installs pve-inspectd on it (DESIGN.md section 9).
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "pve-bootstrap: not built yet (issue 9)")
	os.Exit(2)
}
