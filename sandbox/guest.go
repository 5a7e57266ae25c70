package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Guest returns the inside of member vmid: a VM's guest agent (the
// dialer decides about caching; a Windows VM's through
// Options.WinGuests when set), or, for a container, the container
// entered from the node (Options.CTGuests, nothing cached).
func (m *Engine) Guest(vmid int) Guest {
	vm := m.vmOf(vmid)
	if m.o.CTGuests != nil && vm.Kind == apitype.KindLXC {
		return m.o.CTGuests(vmid)
	}
	socket := filepath.Join(m.o.QGADir, strconv.Itoa(vmid)+".qga")
	if m.o.WinGuests != nil && hardening.IsWindows(vm.OSType) {
		return m.o.WinGuests(socket)
	}
	return m.o.Guests(socket)
}

// waitAgent pings the VM's agent until it answers or AgentTimeout passes.
func (m *Engine) waitAgent(ctx context.Context, vmid int) error {
	ctx, cancel := context.WithTimeout(ctx, m.o.AgentTimeout)
	defer cancel()
	g := m.Guest(vmid)
	delay := 100 * time.Millisecond
	for {
		pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
		err := g.Ping(pctx)
		pcancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vm %d: wait for guest agent: %w (last: %v)", vmid, ErrGuestUnavailable, err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 2*time.Second)
	}
}

// waitRunning waits until VM vmid runs, within AgentTimeout as waitAgent:
// the readiness of a VM without a guest agent. Running is Proxmox's
// status running with the guest's CPUs running (QMP status running, when
// the status reader gives one): a VM paused from its start (QMP status
// prelaunch, as a template with `freeze: 1` has it; io-error) is running
// for Proxmox but never boots, and is not ready. A start task that ended
// OK has the VM running, so a VM Proxmox then reports stopped has stopped
// (its guest powered itself off, or QEMU ended) and will not run by
// itself: that fails at once.
func (m *Engine) waitRunning(ctx context.Context, vmid int) error {
	ctx, cancel := context.WithTimeout(ctx, m.o.AgentTimeout)
	defer cancel()
	delay := 100 * time.Millisecond
	for {
		st, err := m.health.o.Status.VMStatus(ctx, vmid)
		switch {
		case err == nil && st.Status == "running" && (st.QMPStatus == "" || st.QMPStatus == "running"):
			return nil
		case err == nil && st.Status == "stopped":
			// the guest is gone as an agent VM's that never answers
			// (ErrGuestUnavailable: 502), not the daemon's fault (500)
			return fmt.Errorf("vm %d (no guest agent): wait for Proxmox to report it running: it stopped after its start (its guest powered itself off, or QEMU ended): %w", vmid, ErrGuestUnavailable)
		}
		last := fmt.Sprintf("status %q, QMP status %q", st.Status, st.QMPStatus)
		if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vm %d (no guest agent): wait for Proxmox to report it running: %w (last: %s)", vmid, ctx.Err(), last)
		case <-time.After(delay):
		}
		delay = min(delay*2, 2*time.Second)
	}
}

// GuestExec is what a guest runs (the guest agent client converts it to
// its own request).
type GuestExec struct {
	Argv    []string
	Stdin   []byte
	Cwd     string
	Env     map[string]string
	User    string
	Timeout int64 // seconds
	// OutputLimit caps each stream; the result says which was truncated.
	OutputLimit int64
}

// Guest is one VM's guest agent: the parts of the guest agent client the
// engine, the file calls and the checks need. Implemented by qga.Guest;
// errors wrap the Err* guest sentinels (errors.go).
type Guest interface {
	Ping(ctx context.Context) error
	Exec(ctx context.Context, r GuestExec) (*apitype.ExecResult, error)
	// ExecStream copies output to the writers while the command runs and
	// returns the final result (its Stdout/Stderr may be empty).
	ExecStream(ctx context.Context, r GuestExec, stdout, stderr io.Writer) (*apitype.ExecResult, error)
	WriteFile(ctx context.Context, path string, r io.Reader, mode os.FileMode) error
	// ReadFile copies the file to w and fails with ErrTooLarge (wrapped)
	// once more than max bytes would be copied.
	ReadFile(ctx context.Context, path string, w io.Writer, max int64) (int64, error)
}

// GuestDialer returns the Guest behind an agent socket path
// (<QGADir>/<vmid>.qga).
type GuestDialer func(socketPath string) Guest
