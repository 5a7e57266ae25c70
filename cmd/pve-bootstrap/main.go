// Command pve-bootstrap builds a Proxmox VE node, nested in a KVM host's libvirt or on
// EC2, and installs pve-inspectd on it (DESIGN.md section 9).
//
//	pve-bootstrap node plan|apply|status [--json]   on the machine itself
//	pve-bootstrap ec2 userdata|launch               from an operator's machine
//	pve-bootstrap nested create|list|start|stop|delete|clone   in a KVM host's libvirt
//
// Exit status: 0 success (also when apply started a reboot), 3 a recipe step
// failed (its output and the resume command are printed), 1 anything else.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/pve-inspect/pve-inspect/provision"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd(defaultDeps()).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pve-bootstrap:", err)
		var se *provision.StepError
		if errors.As(err, &se) {
			os.Exit(3)
		}
		os.Exit(1)
	}
}
