package provision

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// Cmd is one command to run: argv, optional stdin and extra environment.
type Cmd struct {
	Argv  []string
	Stdin []byte
	Env   []string
}

// String renders the command for messages (stdin is never shown).
func (c Cmd) String() string { return strings.Join(c.Argv, " ") }

// Result is what a command produced.
type Result struct {
	Stdout []byte
	Stderr []byte
}

// Output returns stdout and stderr joined, for error messages.
func (r Result) Output() string {
	return strings.TrimSpace(string(r.Stdout) + string(r.Stderr))
}

// ExitError reports a command that ran and exited non-zero.
type ExitError struct {
	Cmd    string
	Code   int
	Result Result
}

func (e *ExitError) Error() string {
	return fmt.Sprintf("%s: exit status %d: %s", e.Cmd, e.Code, e.Result.Output())
}

// Runner runs commands on the machine being provisioned.
type Runner interface {
	// Run runs c to completion. A non-zero exit is an *ExitError, with the
	// Result also returned.
	Run(ctx context.Context, c Cmd) (Result, error)
}

// ExecRunner runs commands with os/exec.
type ExecRunner struct {
	// Env is added to every command's environment (after os.Environ).
	Env []string
}

// Run implements Runner.
func (r ExecRunner) Run(ctx context.Context, c Cmd) (Result, error) {
	if len(c.Argv) == 0 {
		return Result{}, errors.New("run: empty command")
	}
	cmd := exec.CommandContext(ctx, c.Argv[0], c.Argv[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if c.Stdin != nil {
		cmd.Stdin = bytes.NewReader(c.Stdin)
	}
	cmd.Env = append(append(cmd.Environ(), r.Env...), c.Env...)
	err := cmd.Run()
	res := Result{Stdout: out.Bytes(), Stderr: errb.Bytes()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return res, &ExitError{Cmd: c.String(), Code: ee.ExitCode(), Result: res}
	}
	if err != nil {
		return res, fmt.Errorf("run %s: %w", c, err)
	}
	return res, nil
}

// run is a helper that runs argv without stdin.
func run(ctx context.Context, r Runner, argv ...string) (Result, error) {
	return r.Run(ctx, Cmd{Argv: argv})
}
