// Command pve-inspect-probe runs inside a sandbox VM and reports which
// network targets answer (DESIGN.md section 7). The host's containment
// runner uploads it through the guest agent; see package
// containment/probe for the request and report formats.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pve-inspect/pve-inspect/containment/probe"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := probe.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
