package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// errEnvWrite marks a failed write of the secrets file; its message never
// carries a value.
var errEnvWrite = errors.New("write secrets file")

// writeEnv writes env into the VM at GuestEnvPath, mode 0600 (nothing when
// env is empty). The error names the VM and the cause, never a value.
func (m *Engine) writeEnv(ctx context.Context, vmid int, env map[string]string) error {
	if len(env) == 0 {
		return nil
	}
	err := m.Guest(vmid).WriteFile(ctx, apitype.GuestEnvPath, bytes.NewReader(apitype.EnvFile(env)), 0o600)
	if err != nil {
		return fmt.Errorf("vm %d: %w %s: %s", vmid, errEnvWrite, apitype.GuestEnvPath, guestCause(err))
	}
	return nil
}

// guestCause names why a guest call failed by the sentinel it wraps (the
// sentinel's own text), never by the error's text, which may quote what
// was sent.
func guestCause(err error) string {
	for _, s := range []error{ErrGuestInvalid, ErrTooLarge, ErrFileNotFound, ErrIsDirectory, ErrPermission,
		ErrGuestNoSpace, ErrGuestTimeout, ErrGuestUnavailable, ErrGuestProtocol, context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "failed"
}
