package containment

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/pve-inspect/pve-inspect/containment/probe"
	"github.com/pve-inspect/pve-inspect/qga"
)

// AgentGuest is the Guest the daemon uses: the guest agent client on one
// VM's agent socket.
type AgentGuest struct{ Agent *qga.Agent }

// WriteFile uploads r to path in the guest.
func (g AgentGuest) WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) error {
	return g.Agent.WriteFile(ctx, path, r, mode)
}

// Exec runs argv in the guest. Output is capped one byte over the report
// parser's bound, so an oversized report is refused rather than cut.
func (g AgentGuest) Exec(ctx context.Context, argv []string, stdin []byte, timeout time.Duration) ([]byte, []byte, int, error) {
	res, err := g.Agent.Exec(ctx, qga.ExecRequest{Argv: argv, Stdin: stdinOf(stdin), Timeout: timeout,
		OutputLimit: probe.MaxReportBytes + 1})
	if err != nil {
		return nil, nil, 0, err
	}
	if res.TimedOut {
		return nil, nil, 0, fmt.Errorf("probe killed after %v (its stderr: %q)", timeout, tail(res.Stderr, 512))
	}
	return res.Stdout, res.Stderr, res.ExitCode, nil
}

// tail is the last n bytes of b, for an error's text.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// stdinOf is the exec's stdin: none for an empty one, so that an
// argv-only command takes the agent's direct path.
func stdinOf(b []byte) io.Reader {
	if len(b) == 0 {
		return nil
	}
	return bytes.NewReader(b)
}
