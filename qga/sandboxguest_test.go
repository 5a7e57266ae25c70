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
