// Package emuguest is a sandbox.Guest for VMs of the emulator's fake
// backend (pveemu.FakeBackend), which runs no guest: the guest answers
// Ping while the VM's agent socket exists (the backend creates it when the
// VM starts and removes it when it stops) and refuses all guest I/O but
// the daemon's naming of a guest (sandbox names.go), which every create
// does: its exec answers as for a guest without /etc/hosts and its two
// writes (/etc/hosts, /etc/hostname) are accepted and dropped. Guest I/O
// is exercised with the real agent on the bed.
package emuguest

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Dial is a sandbox.GuestDialer: the guest behind the agent socket path.
func Dial(path string) sandbox.Guest { return guest{path} }

type guest struct{ path string }

func (g guest) Ping(context.Context) error {
	if _, err := os.Stat(g.path); err != nil {
		return fmt.Errorf("%w: %v", sandbox.ErrGuestUnavailable, err)
	}
	return nil
}

func (g guest) Exec(ctx context.Context, r sandbox.GuestExec) (*apitype.ExecResult, error) {
	if !sandbox.IsNamingExec(r) {
		return nil, sandbox.ErrGuestUnavailable
	}
	if err := g.Ping(ctx); err != nil {
		return nil, err
	}
	return &apitype.ExecResult{ExitCode: 4, Stdout: []byte{}, Stderr: []byte{}}, nil
}

func (guest) ExecStream(context.Context, sandbox.GuestExec, io.Writer, io.Writer) (*apitype.ExecResult, error) {
	return nil, sandbox.ErrGuestUnavailable
}

func (g guest) WriteFile(ctx context.Context, path string, r io.Reader, _ os.FileMode) error {
	if path != "/etc/hosts" && path != "/etc/hostname" {
		return sandbox.ErrGuestUnavailable
	}
	if err := g.Ping(ctx); err != nil {
		return err
	}
	_, err := io.Copy(io.Discard, r)
	return err
}

func (guest) ReadFile(context.Context, string, io.Writer, int64) (int64, error) {
	return 0, sandbox.ErrGuestUnavailable
}
