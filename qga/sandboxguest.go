// Package qgaguest adapts the guest agent client (qga) to the
// sandbox API's Guest interface, mapping its errors to the sandboxapi
// sentinels so the API answers with the right problem types.
package qga

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
)

// Dialer returns a sandboxapi.GuestDialer over c (one Agent per socket;
// the client serializes commands per VM).
func Dialer(c *qga.Client) sandboxapi.GuestDialer {
	return func(socket string) sandboxapi.Guest { return guest{a: c.Agent(socket)} }
}

type guest struct{ a *qga.Agent }

// mapErr wraps a qga error with the matching sandboxapi sentinel.
func mapErr(err error) error {
	if err == nil {
		return nil
	}
	var pe *qga.ProtocolError
	switch {
	case errors.Is(err, qga.ErrTooLarge):
		return fmt.Errorf("%w: %w", sandboxapi.ErrTooLarge, err)
	case errors.Is(err, qga.ErrNotFound):
		return fmt.Errorf("%w: %w", sandboxapi.ErrFileNotFound, err)
	case errors.Is(err, qga.ErrIsDir):
		return fmt.Errorf("%w: %w", sandboxapi.ErrIsDirectory, err)
	case errors.Is(err, qga.ErrPermission):
		return fmt.Errorf("%w: %w", sandboxapi.ErrPermission, err)
	case errors.Is(err, qga.ErrInvalid):
		return fmt.Errorf("%w: %w", sandboxapi.ErrGuestInvalid, err)
	case errors.As(err, &pe):
		switch pe.Kind {
		case qga.KindConnect, qga.KindClosed:
			return fmt.Errorf("%w: %w", sandboxapi.ErrGuestUnavailable, err)
		case qga.KindTimeout:
			return fmt.Errorf("%w: %w", sandboxapi.ErrGuestTimeout, err)
		default:
			return fmt.Errorf("%w: %w", sandboxapi.ErrGuestProtocol, err)
		}
	}
	return err
}

func request(r sandboxapi.GuestExec) qga.ExecRequest {
	q := qga.ExecRequest{Argv: r.Argv, Env: r.Env, Cwd: r.Cwd, User: r.User,
		Timeout: time.Duration(r.Timeout) * time.Second, OutputLimit: r.OutputLimit}
	if len(r.Stdin) > 0 {
		q.Stdin = bytes.NewReader(r.Stdin)
	}
	return q
}

func result(res *qga.ExecResult) *sandboxapi.ExecResult {
	out := &sandboxapi.ExecResult{ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr,
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated, TimedOut: res.TimedOut}
	if out.Stdout == nil {
		out.Stdout = []byte{}
	}
	if out.Stderr == nil {
		out.Stderr = []byte{}
	}
	return out
}

func (g guest) Ping(ctx context.Context) error { return mapErr(g.a.Ping(ctx)) }

func (g guest) Exec(ctx context.Context, r sandboxapi.GuestExec) (*sandboxapi.ExecResult, error) {
	res, err := g.a.Exec(ctx, request(r))
	if err != nil {
		return nil, mapErr(err)
	}
	return result(res), nil
}

func (g guest) ExecStream(ctx context.Context, r sandboxapi.GuestExec, stdout, stderr io.Writer) (*sandboxapi.ExecResult, error) {
	res, err := g.a.ExecStream(ctx, request(r), stdout, stderr)
	if err != nil {
		return nil, mapErr(err)
	}
	return result(res), nil
}

func (g guest) WriteFile(ctx context.Context, path string, r io.Reader, mode os.FileMode) error {
	return mapErr(g.a.WriteFile(ctx, path, r, mode))
}

func (g guest) ReadFile(ctx context.Context, path string, w io.Writer, max int64) (int64, error) {
	n, err := g.a.ReadFile(ctx, path, w, max)
	return n, mapErr(err)
}

// ReadFileSized lets the API check a download's size before its first
// byte and stream it without a spool.
func (g guest) ReadFileSized(ctx context.Context, path string, w io.Writer, max int64, size func(int64) error) (int64, error) {
	n, err := g.a.ReadFileSized(ctx, path, w, max, size)
	return n, mapErr(err)
}
