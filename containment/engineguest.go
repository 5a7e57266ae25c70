package containment

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/pve-inspect/pve-inspect/containment/probe"
	"github.com/pve-inspect/pve-inspect/sandbox"
)

// EngineGuest is a Guest (and StreamGuest) over the sandbox engine's
// guest of a member: what the check runs a container's probe through. A
// container has no agent; its sandbox.Guest (package ctguest) enters the
// container's namespaces from the node, as its root under its id map,
// seccomp filter and LSM profile, so the probe sees exactly what the
// container's own root sees. VMs keep AgentGuest: the agent client
// directly, with timeouts finer than the engine's whole seconds.
type EngineGuest struct{ Guest sandbox.Guest }

var _ StreamGuest = EngineGuest{}

// WriteFile uploads r to path in the guest.
func (g EngineGuest) WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) error {
	return g.Guest.WriteFile(ctx, path, r, mode)
}

// Exec runs argv in the guest. Output is capped one byte over the report
// parser's bound, so an oversized report is refused rather than cut.
func (g EngineGuest) Exec(ctx context.Context, argv []string, stdin []byte, timeout time.Duration) ([]byte, []byte, int, error) {
	res, err := g.Guest.Exec(ctx, engineExec(argv, stdin, timeout))
	if err != nil {
		return nil, nil, 0, err
	}
	if res.TimedOut {
		return nil, nil, 0, fmt.Errorf("probe killed after %v (its stderr: %q)", timeout, tail(res.Stderr, 512))
	}
	return res.Stdout, res.Stderr, res.ExitCode, nil
}

// ExecStream implements StreamGuest: stderr goes to w while the probe runs.
func (g EngineGuest) ExecStream(ctx context.Context, argv []string, stdin []byte, timeout time.Duration, w io.Writer) ([]byte, int, error) {
	var out bytes.Buffer
	res, err := g.Guest.ExecStream(ctx, engineExec(argv, stdin, timeout), &out, w)
	if err != nil {
		return nil, 0, err
	}
	if res.TimedOut {
		return nil, 0, fmt.Errorf("probe killed after %v (its stderr: %q)", timeout, tail(stderrSeen(w), 512))
	}
	return out.Bytes(), res.ExitCode, nil
}

// engineExec is the engine's exec of argv: the timeout rounded up to
// whole seconds (the engine's unit), each stream capped one byte over the
// report's bound.
func engineExec(argv []string, stdin []byte, timeout time.Duration) sandbox.GuestExec {
	return sandbox.GuestExec{Argv: argv, Stdin: stdin, Timeout: int64((timeout + time.Second - 1) / time.Second),
		OutputLimit: probe.MaxReportBytes + 1}
}
