package provision

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
)

// Reply is a recorded answer for one command, matched by its argv prefix.
type Reply struct {
	// Prefix is matched against the start of the argv, joined by spaces.
	Prefix string
	// Stdout is returned as the command's output.
	Stdout string
	// Code is the exit status; non-zero yields an *ExitError.
	Code int
	// Missing answers as os/exec does for a command not on PATH.
	Missing bool
	// Times limits how often the reply is used (0 = always).
	Times int
	used  int
}

// RecordingRunner is a Runner for tests: it records every command and
// answers from a list of replies (first unused match wins). A command with no
// matching reply fails, so a test learns about every command it did not
// expect.
type RecordingRunner struct {
	mu      sync.Mutex
	Replies []*Reply
	Calls   []Cmd
}

// Run implements Runner.
func (r *RecordingRunner) Run(_ context.Context, c Cmd) (Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Calls = append(r.Calls, c)
	line := c.String()
	for _, rep := range r.Replies {
		if rep.Times > 0 && rep.used >= rep.Times {
			continue
		}
		if line == rep.Prefix || strings.HasPrefix(line, rep.Prefix+" ") {
			rep.used++
			res := Result{Stdout: []byte(rep.Stdout)}
			if rep.Missing {
				return Result{}, fmt.Errorf("run %s: %w", line, &exec.Error{Name: c.Argv[0], Err: exec.ErrNotFound})
			}
			if rep.Code != 0 {
				return res, &ExitError{Cmd: line, Code: rep.Code, Result: res}
			}
			return res, nil
		}
	}
	return Result{}, fmt.Errorf("recording runner: unexpected command %q", line)
}

// Lines returns the recorded commands as strings.
func (r *RecordingRunner) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.Calls))
	for i, c := range r.Calls {
		out[i] = c.String()
	}
	return out
}
