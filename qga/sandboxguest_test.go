package qga

import (
	"errors"
	"fmt"
	"testing"

	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
)

func TestMapErr(t *testing.T) {
	tests := []struct {
		in   error
		want error
	}{
		{&qga.PathError{Op: "read", Path: "/x", Err: qga.ErrNotFound}, sandboxapi.ErrFileNotFound},
		{&qga.PathError{Op: "read", Path: "/x", Err: &qga.AgentError{Command: "guest-file-open", Class: "GenericError", Desc: "failed to open file '/x' (mode: 'r'): No such file or directory"}}, sandboxapi.ErrFileNotFound},
		{&qga.PathError{Op: "read", Path: "/", Err: qga.ErrIsDir}, sandboxapi.ErrIsDirectory},
		{&qga.PathError{Op: "write", Path: "/proc/x", Err: qga.ErrPermission}, sandboxapi.ErrPermission},
		{fmt.Errorf("read: %w", qga.ErrTooLarge), sandboxapi.ErrTooLarge},
		{fmt.Errorf("%w: bad env name", qga.ErrInvalid), sandboxapi.ErrGuestInvalid},
		{&qga.ProtocolError{Kind: qga.KindConnect, Command: "guest-sync-delimited"}, sandboxapi.ErrGuestUnavailable},
		{&qga.ProtocolError{Kind: qga.KindClosed, Command: "guest-exec"}, sandboxapi.ErrGuestUnavailable},
		{&qga.ProtocolError{Kind: qga.KindTimeout, Command: "guest-exec-status"}, sandboxapi.ErrGuestTimeout},
		{&qga.ProtocolError{Kind: qga.KindMalformed, Command: "guest-exec-status"}, sandboxapi.ErrGuestProtocol},
		{&qga.ProtocolError{Kind: qga.KindWrongID, Command: "guest-ping"}, sandboxapi.ErrGuestProtocol},
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
