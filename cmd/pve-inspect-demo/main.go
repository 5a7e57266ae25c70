// Command pve-inspect-demo tells the whole story on the node in a box (the
// test bed): a node with the Proxmox API emulator, the containment probe
// seeing every leak while nothing guards the node, then pve-inspectd
// running with its guard, a sandbox of two VMs created through the sandbox
// API, an exec and a file round trip, the containment check (all PASS),
// the egress lockdown switched on and the check again, and everything torn
// down. Needs root; `make demo` runs it.
package main

import (
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"

	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// options are the demo's flags.
type options struct {
	binDir  string
	timeout time.Duration
	// stay runs the playground instead of the demo; listen is its
	// loopback address for the API and MCP over HTTP.
	stay   bool
	listen string
	// diskStorage is the playground daemon's [api]
	// disk_transfer_storage ("" = the disk path off).
	diskStorage string
	// release is the Proxmox VE release the emulator behaves as.
	release string
	// referencePlugin readies the playground for the reference plugin's
	// own suite (scripts/reference-suite.sh): root@pam's password in a
	// file, a template tagged as its built-in, the dir storage's content
	// as its README sets it.
	referencePlugin bool
	// restart receives a value for each restart of the playground's
	// daemon asked for (SIGHUP); nil in the demo.
	restart <-chan os.Signal
}

func main() {
	var o options
	self, _ := os.Executable()
	flag.StringVar(&o.binDir, "bin", filepath.Dir(self), "directory holding pve-inspectd and pve-inspect-probe")
	flag.DurationVar(&o.timeout, "timeout", 15*time.Minute, "deadline of the whole demo (not of --stay)")
	flag.BoolVar(&o.stay, "stay", false, "playground: bring the node in a box up with the daemon, its API and MCP server, print how to reach them, stay until Ctrl-C/SIGTERM (SIGHUP restarts its daemon)")
	flag.StringVar(&o.listen, "listen", "127.0.0.1:8443", "playground: loopback address forwarded to the daemon's TLS API listener (port 0: any)")
	flag.StringVar(&o.diskStorage, "disk-transfer-storage", "", "playground: turn the daemon's disk path on, on this storage (the node's dir storage is \"local\")")
	flag.StringVar(&o.release, "pve-release", string(pveemu.Release91), "playground: the Proxmox VE release the emulated API behaves as (9.1 or 9.2)")
	flag.BoolVar(&o.referencePlugin, "reference-plugin", false, "playground: ready the node for the reference Inspect plugin's suite (scripts/reference-suite.sh)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var cancel context.CancelFunc
	var err error
	if o.stay {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		o.restart = hup
		ctx, cancel = context.WithCancel(ctx)
		err = playground(ctx, o, os.Stdout)
	} else {
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		err = run(ctx, o, os.Stdout)
	}
	cancel()
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pve-inspect-demo:", err)
		os.Exit(1)
	}
}
