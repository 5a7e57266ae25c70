package qga

// This file makes the client a guest of the sandbox engine: Guest
// satisfies sandbox.Guest, and its errors wrap the engine's guest
// sentinels (sandbox.ErrFileNotFound, ...) so the API answers with the
// right problem types.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// SandboxGuests returns the sandbox.GuestDialer over c (one Agent per
// socket; the client serializes commands per VM).
func (c *Client) SandboxGuests() sandbox.GuestDialer {
	return func(socket string) sandbox.Guest { return Guest{a: c.Agent(socket)} }
}

// Guest is one VM's agent as the sandbox engine sees it: sandbox.Guest
// (and the sized read the API streams downloads with) over an Agent.
type Guest struct{ a *Agent }

var _ sandbox.Guest = Guest{}

// mapErr wraps an agent error with the matching sandbox sentinel.
func mapErr(err error) error {
	if err == nil {
		return nil
	}
	var pe *ProtocolError
	switch {
	case errors.Is(err, ErrFrozen):
		return fmt.Errorf("%w: the guest's file systems are frozen for a snapshot: retry when it ends: %w", sandbox.ErrConflict, err)
	case errors.Is(err, ErrBudget):
		return fmt.Errorf("%w: %w", sandbox.ErrBusy, err)
	case errors.Is(err, ErrOwnerBudget):
		return fmt.Errorf("%w: %w", sandbox.ErrOwnerBusy, err)
	case errors.Is(err, ErrTooLarge):
		return fmt.Errorf("%w: %w", sandbox.ErrTooLarge, err)
	case errors.Is(err, ErrNotFound):
		return fmt.Errorf("%w: %w", sandbox.ErrFileNotFound, err)
	case errors.Is(err, ErrIsDir):
		return fmt.Errorf("%w: %w", sandbox.ErrIsDirectory, err)
	case errors.Is(err, ErrPermission):
		return fmt.Errorf("%w: %w", sandbox.ErrPermission, err)
	case errors.Is(err, ErrInvalid):
		return fmt.Errorf("%w: %w", sandbox.ErrGuestInvalid, err)
	case errors.As(err, &pe):
		switch pe.Kind {
		case KindConnect, KindClosed:
			return fmt.Errorf("%w: %w", sandbox.ErrGuestUnavailable, err)
		case KindTimeout:
			return fmt.Errorf("%w: %w", sandbox.ErrGuestTimeout, err)
		default:
			return fmt.Errorf("%w: %w", sandbox.ErrGuestProtocol, err)
		}
	}
	return err
}

func sandboxRequest(r sandbox.GuestExec) ExecRequest {
	q := ExecRequest{Argv: r.Argv, Env: r.Env, Cwd: r.Cwd, User: r.User,
		Timeout: time.Duration(r.Timeout) * time.Second, OutputLimit: r.OutputLimit}
	if len(r.Stdin) > 0 {
		q.Stdin = bytes.NewReader(r.Stdin)
	}
	return q
}

func sandboxResult(res *ExecResult) *apitype.ExecResult {
	out := &apitype.ExecResult{ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr,
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated, TimedOut: res.TimedOut}
	if out.Stdout == nil {
		out.Stdout = []byte{}
	}
	if out.Stderr == nil {
		out.Stderr = []byte{}
	}
	return out
}

// Ping implements sandbox.Guest.
func (g Guest) Ping(ctx context.Context) error { return mapErr(g.a.Ping(ctx)) }

// Exec implements sandbox.Guest.
func (g Guest) Exec(ctx context.Context, r sandbox.GuestExec) (*apitype.ExecResult, error) {
	res, err := g.a.Exec(ctx, sandboxRequest(r))
	if err != nil {
		return nil, mapErr(err)
	}
	return sandboxResult(res), nil
}

// ExecStream implements sandbox.Guest.
func (g Guest) ExecStream(ctx context.Context, r sandbox.GuestExec, stdout, stderr io.Writer) (*apitype.ExecResult, error) {
	res, err := g.a.ExecStream(ctx, sandboxRequest(r), stdout, stderr)
	if err != nil {
		return nil, mapErr(err)
	}
	return sandboxResult(res), nil
}

// WriteFile implements sandbox.Guest.
func (g Guest) WriteFile(ctx context.Context, path string, r io.Reader, mode os.FileMode) error {
	return mapErr(g.a.WriteFile(ctx, path, r, mode))
}

// ReadFile implements sandbox.Guest.
func (g Guest) ReadFile(ctx context.Context, path string, w io.Writer, max int64) (int64, error) {
	n, err := g.a.ReadFile(ctx, path, w, max)
	return n, mapErr(err)
}

// ReadFileSized lets the API check a download's size before its first
// byte and stream it without a spool.
func (g Guest) ReadFileSized(ctx context.Context, path string, w io.Writer, max int64, size func(int64) error) (int64, error) {
	n, err := g.a.ReadFileSized(ctx, path, w, max, size)
	return n, mapErr(err)
}

// WindowsGuests returns the sandbox.GuestDialer of Windows guests over c
// (windows.go): argv through guest-exec, shell strings and working
// directories through batch files, Windows paths for the file calls.
func (c *Client) WindowsGuests() sandbox.GuestDialer {
	return func(socket string) sandbox.Guest {
		a := c.Agent(socket)
		a.win = true
		return WinGuest{a: a}
	}
}

// WinGuest is one Windows VM's agent as the sandbox engine sees it.
type WinGuest struct{ a *Agent }

var _ sandbox.Guest = WinGuest{}

// Ping implements sandbox.Guest.
func (g WinGuest) Ping(ctx context.Context) error { return mapErr(g.a.Ping(ctx)) }

// Exec implements sandbox.Guest.
func (g WinGuest) Exec(ctx context.Context, r sandbox.GuestExec) (*apitype.ExecResult, error) {
	res, err := g.a.winExec(ctx, sandboxRequest(r))
	if err != nil {
		return nil, mapErr(err)
	}
	return sandboxResult(res), nil
}

// ExecStream implements sandbox.Guest: the output is written once the
// command ended (qemu-ga gives captured output only then).
func (g WinGuest) ExecStream(ctx context.Context, r sandbox.GuestExec, stdout, stderr io.Writer) (*apitype.ExecResult, error) {
	res, err := g.a.winStream(ctx, sandboxRequest(r), stdout, stderr)
	if err != nil {
		return nil, mapErr(err)
	}
	return sandboxResult(res), nil
}

// WriteFile implements sandbox.Guest; mode is not applied (NTFS).
func (g WinGuest) WriteFile(ctx context.Context, path string, r io.Reader, mode os.FileMode) error {
	return mapErr(g.a.winWriteFile(ctx, path, r, mode))
}

// ReadFile implements sandbox.Guest.
func (g WinGuest) ReadFile(ctx context.Context, path string, w io.Writer, max int64) (int64, error) {
	n, err := g.a.winReadFile(ctx, path, w, max, nil)
	return n, mapErr(err)
}

// ReadFileSized is ReadFile with the size known before the first byte
// (the API's streamed download).
func (g WinGuest) ReadFileSized(ctx context.Context, path string, w io.Writer, max int64, size func(int64) error) (int64, error) {
	if size == nil {
		return 0, mapErr(fmt.Errorf("%w: nil size callback", ErrInvalid))
	}
	n, err := g.a.winReadFile(ctx, path, w, max, size)
	return n, mapErr(err)
}

// Filesystems reports the guest's file systems for the health checks
// (guest-get-fsinfo, which qemu-ga's Windows build answers with its
// volumes).
func (g WinGuest) Filesystems(ctx context.Context) ([]apitype.GuestFilesystem, error) {
	return Guest(g).Filesystems(ctx)
}
