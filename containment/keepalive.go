package containment

// This file is the host side of the keep-alive row (EgressSpec.KeepAlive):
// the probe opens a keep-alive connection through the egress proxy and,
// once its first request is answered, writes a ready line to stderr; the
// runner, reading the probe's stderr while it runs (StreamGuest), then
// calls Change (the sandbox's policy re-applied: a new generation, so the
// daemon cuts every proxied connection of the zone) and writes the
// signal file, and the probe sends its second request on the old
// connection, which must fail.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/containment/probe"
	"github.com/pve-inspect/pve-inspect/qga"
)

// StreamGuest is a Guest that hands a command's stderr over while the
// command runs: the keep-alive row needs it to hear that the probe's
// first request was answered.
type StreamGuest interface {
	Guest
	// ExecStream runs argv like Exec, but writes stderr to w as it comes
	// (and leaves the returned stderr empty).
	ExecStream(ctx context.Context, argv []string, stdin []byte, timeout time.Duration, w io.Writer) (stdout []byte, exit int, err error)
}

// ExecStream implements StreamGuest.
func (g AgentGuest) ExecStream(ctx context.Context, argv []string, stdin []byte, timeout time.Duration, w io.Writer) ([]byte, int, error) {
	var out bytes.Buffer
	res, err := g.Agent.ExecStream(ctx, qga.ExecRequest{Argv: argv, Stdin: stdinOf(stdin), Timeout: timeout,
		OutputLimit: probe.MaxReportBytes + 1}, &out, w)
	if err != nil {
		return nil, 0, err
	}
	if res.TimedOut {
		return nil, 0, fmt.Errorf("probe killed after %v (its stderr: %q)", timeout, tail(stderrSeen(w), 512))
	}
	return out.Bytes(), res.ExitCode, nil
}

// maxStderr bounds the probe stderr the runner keeps for its error text.
const maxStderr = 4 << 10

// readyWatch is the probe's stderr during a plan with keep-alive rows:
// once every such row said it is ready, it calls change and then signal,
// once. It is written from one goroutine (the exec's).
type readyWatch struct {
	ctx    context.Context
	want   map[string]bool // keep-alive row ids not ready yet
	change func(context.Context) error
	signal func(context.Context) error
	line   []byte // the partial last line
	kept   []byte // the stderr, bounded, for error text
	fired  bool
	err    error // from change or signal
}

func (w *readyWatch) Write(b []byte) (int, error) {
	if room := maxStderr - len(w.kept); room > 0 {
		w.kept = append(w.kept, b[:min(room, len(b))]...)
	}
	w.line = append(w.line, b...)
	for {
		i := bytes.IndexByte(w.line, '\n')
		if i < 0 {
			break
		}
		if id, ok := strings.CutPrefix(string(w.line[:i]), probe.ReadyPrefix); ok {
			delete(w.want, id)
		}
		w.line = w.line[i+1:]
	}
	if len(w.line) > maxStderr {
		w.line = w.line[:0] // no ready line is this long
	}
	if len(w.want) == 0 && !w.fired {
		w.fired = true
		if err := w.change(w.ctx); err != nil {
			w.err = fmt.Errorf("the policy change of the keep-alive row: %w", err)
		}
		// the signal goes out even if the change failed, so the probe
		// ends now rather than at its wait's bound
		if err := w.signal(w.ctx); err != nil && w.err == nil {
			w.err = fmt.Errorf("the keep-alive row's signal: %w", err)
		}
	}
	return len(b), nil
}

// execKeepAlive runs the probe of a plan with keep-alive rows: its stderr
// is watched for the ready lines, and Change runs between the rows' two
// requests.
func (r *Runner) execKeepAlive(ctx context.Context, g Guest, p *Plan, argv []string, stdin []byte, timeout time.Duration,
	signal string) (stdout, stderr []byte, exit int, err error) {
	sg, ok := g.(StreamGuest)
	if !ok {
		return nil, nil, 0, fmt.Errorf("%w: the keep-alive row needs a guest that streams the probe's stderr", ErrProbe)
	}
	if r.Change == nil {
		return nil, nil, 0, fmt.Errorf("%w: the keep-alive row needs the runner's Change (the policy re-applied)", ErrProbe)
	}
	w := &readyWatch{ctx: ctx, want: map[string]bool{}, change: r.Change,
		signal: func(ctx context.Context) error { return g.WriteFile(ctx, signal, strings.NewReader(""), 0o600) }}
	for _, c := range p.Checks {
		if c.Target.Kind == probe.KindKeepAlive {
			w.want[c.Target.ID] = true
		}
	}
	stdout, exit, err = sg.ExecStream(ctx, argv, stdin, timeout, w)
	if err == nil {
		err = w.err
	}
	return stdout, w.kept, exit, err
}

// stderrSeen is what the probe wrote to w, when w keeps it (readyWatch).
func stderrSeen(w io.Writer) []byte {
	if rw, ok := w.(*readyWatch); ok {
		return rw.kept
	}
	return nil
}
