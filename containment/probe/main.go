package probe

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

// RunGrace is what a run may take past [RunBound] (scheduling on a busy
// guest) before the probe ends its unfinished rows as errors and reports.
// The host's exec timeout allows more, so the report comes back.
const RunGrace = 10 * time.Second

// Exit codes of [Main].
const (
	ExitOK    = 0 // a report was written
	ExitUsage = 2 // bad arguments or request; nothing was probed
	ExitIO    = 3 // the report could not be written
)

// Main is the probe program: `pve-inspect-probe [-root DIR] [-self-remove] [REQUEST.json]`
// reads the request from the file or, without one, from stdin, and writes
// the report as one JSON line to stdout.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return run(ctx, args, stdin, stdout, stderr, nil)
}

// run is Main with the dialer as a parameter (nil = net.Dialer).
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, d Dialer) int {
	fs := flag.NewFlagSet("pve-inspect-probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("root", "/", "prefix of the /proc and /etc paths the facts are read from")
	selfRemove := fs.Bool("self-remove", false, "delete the probe's own executable and its request file at start (both were uploaded for one run)")
	nested := fs.String(nestedProcFlag[1:], "", "internal: the nesting row's child (in its new namespaces): mount proc on DIR, say how it went")
	if err := fs.Parse(args); err != nil {
		return ExitUsage
	}
	if *nested != "" {
		return NestedProc(*nested, stdout)
	}
	if *selfRemove {
		if exe, err := os.Executable(); err == nil {
			_ = os.Remove(exe) // best effort: a left-over copy is harmless
		}
	}
	if fs.NArg() > 1 {
		fmt.Fprintln(stderr, "pve-inspect-probe: at most one request file")
		return ExitUsage
	}
	in := stdin
	if fs.NArg() == 1 {
		fh, err := os.Open(fs.Arg(0))
		if err != nil {
			fmt.Fprintln(stderr, "pve-inspect-probe:", err)
			return ExitUsage
		}
		defer fh.Close()
		if *selfRemove {
			_ = os.Remove(fs.Arg(0)) // uploaded for this run too; open, it still reads
		}
		in = fh
	}
	req, err := ParseRequest(in)
	if err != nil {
		fmt.Fprintln(stderr, "pve-inspect-probe:", err)
		return ExitUsage
	}
	// progress on stderr: a probe the host had to kill says how far it got
	start := time.Now()
	fmt.Fprintf(stderr, "pve-inspect-probe: request read, %d targets, bound %v\n", len(req.Targets), RunBound(req)+RunGrace)
	// The probe ends its rows at its own bound and reports, well before
	// the host's exec timeout (RunBound plus the host's slack) would kill
	// it without a report: a row cut there is an error, never silence.
	ctx, cancel := context.WithTimeout(ctx, RunBound(req)+RunGrace)
	defer cancel()
	rep := (&Prober{Dialer: d, Root: *root, Ready: stderr, Progress: stderr}).Run(ctx, req)
	fmt.Fprintf(stderr, "pve-inspect-probe: rows done after %v\n", time.Since(start).Round(time.Millisecond))
	if err := json.NewEncoder(stdout).Encode(rep); err != nil {
		fmt.Fprintln(stderr, "pve-inspect-probe: write report:", err)
		return ExitIO
	}
	return ExitOK
}
