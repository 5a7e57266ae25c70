package qga

import (
	"errors"
	"fmt"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

func TestMapErr(t *testing.T) {
	tests := []struct {
		in   error
		want error
	}{
		{&PathError{Op: "read", Path: "/x", Err: ErrNotFound}, sandbox.ErrFileNotFound},
		{&PathError{Op: "read", Path: "/x", Err: &AgentError{Command: "guest-file-open", Class: "GenericError", Desc: "failed to open file '/x' (mode: 'r'): No such file or directory"}}, sandbox.ErrFileNotFound},
		{&PathError{Op: "read", Path: "/", Err: ErrIsDir}, sandbox.ErrIsDirectory},
		{&PathError{Op: "write", Path: "/x", Err: &AgentError{Command: "guest-file-open", Class: "GenericError", Desc: "failed to open file '/xxx' (mode: 'w'): File name too long"}}, sandbox.ErrGuestInvalid},
		{&PathError{Op: "write", Path: "/l", Err: &AgentError{Command: "guest-file-open", Class: "GenericError", Desc: "failed to open file '/l' (mode: 'w'): Too many levels of symbolic links"}}, sandbox.ErrGuestInvalid},
		{&PathError{Op: "write", Path: "/ro/x", Err: &AgentError{Command: "guest-file-open", Class: "GenericError", Desc: "failed to open file '/ro/x' (mode: 'w'): Read-only file system"}}, sandbox.ErrPermission},
		{&PathError{Op: "write", Path: "/proc/x", Err: ErrPermission}, sandbox.ErrPermission},
		{fmt.Errorf("read: %w", ErrTooLarge), sandbox.ErrTooLarge},
		{fmt.Errorf("%w: bad env name", ErrInvalid), sandbox.ErrGuestInvalid},
		{&ProtocolError{Kind: KindConnect, Command: "guest-sync-delimited"}, sandbox.ErrGuestUnavailable},
		{&ProtocolError{Kind: KindClosed, Command: "guest-exec"}, sandbox.ErrGuestUnavailable},
		{&ProtocolError{Kind: KindTimeout, Command: "guest-exec-status"}, sandbox.ErrGuestTimeout},
		{&ProtocolError{Kind: KindMalformed, Command: "guest-exec-status"}, sandbox.ErrGuestProtocol},
		{&ProtocolError{Kind: KindWrongID, Command: "guest-ping"}, sandbox.ErrGuestProtocol},
		// qemu-ga's refusals while frozen, QEMU >= 9.1 and before
		{&AgentError{Command: "guest-exec", Class: "CommandNotFound", Desc: "Command guest-exec has been disabled: the command is not allowed"}, sandbox.ErrConflict},
		{&PathError{Op: "read", Path: "/x", Err: &AgentError{Command: "guest-file-open", Class: "CommandNotFound", Desc: "Command guest-file-open has been disabled: the agent is in frozen state"}}, sandbox.ErrConflict},
	}
	for _, tc := range tests {
		got := mapErr(tc.in)
		if !errors.Is(got, tc.want) {
			t.Errorf("mapErr(%v) = %v, want %v", tc.in, got, tc.want)
		}
		if !errors.Is(got, tc.in) && !errors.Is(got, errors.Unwrap(tc.in)) {
			t.Errorf("mapErr(%v) lost the original error", tc.in)
		}
	}
	if mapErr(nil) != nil {
		t.Error("nil mapped to an error")
	}
}

// TestFrozenRefusal: only qemu-ga's own frozen-state reply to a command
// it disables while frozen is ErrFrozen.
func TestFrozenRefusal(t *testing.T) {
	for _, tc := range []struct {
		e    AgentError
		want bool
	}{
		{AgentError{Command: "guest-exec", Class: "CommandNotFound", Desc: "Command guest-exec has been disabled: the command is not allowed"}, true},
		{AgentError{Command: "guest-file-write", Class: "CommandNotFound", Desc: "Command guest-file-write has been disabled: the agent is in frozen state"}, true},
		{AgentError{Command: "guest-get-fsinfo", Class: "CommandNotFound", Desc: "Command guest-get-fsinfo has been disabled: the command is not allowed"}, true},
		// blocked by the guest's --block-rpcs: no reason
		{AgentError{Command: "guest-exec", Class: "CommandNotFound", Desc: "Command guest-exec has been disabled"}, false},
		{AgentError{Command: "guest-exec", Class: "CommandNotFound", Desc: "The command guest-exec has not been found"}, false},
		{AgentError{Command: "guest-exec", Class: "GenericError", Desc: "Command guest-exec has been disabled: the command is not allowed"}, false},
		// never refused while frozen
		{AgentError{Command: "guest-ping", Class: "CommandNotFound", Desc: "Command guest-ping has been disabled: the command is not allowed"}, false},
		{AgentError{Command: "guest-file-open", Class: "GenericError", Desc: "failed to open file '/x' (mode: 'r'): No such file or directory"}, false},
	} {
		if got := errors.Is(&tc.e, ErrFrozen); got != tc.want {
			t.Errorf("%+v: frozen %v, want %v", tc.e, got, tc.want)
		}
		if got := errors.Is(mapErr(&tc.e), sandbox.ErrConflict); got != tc.want {
			t.Errorf("%+v: mapped to a conflict %v, want %v", tc.e, got, tc.want)
		}
	}
}
