package sandbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestGuestCause: a failed secrets write is explained by the guest
// sentinel it wraps, never by the error's own text (which may quote what
// was sent).
func TestGuestCause(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("write /etc/pve-inspect/env: KEY=sk-secret: %w", ErrGuestNoSpace), "no space left in guest"},
		{fmt.Errorf("%w: agent gone", ErrGuestUnavailable), "guest agent unavailable"},
		{fmt.Errorf("open: %w", ErrPermission), "permission denied in guest"},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), "context deadline exceeded"},
		{errors.New("KEY=sk-secret went wrong"), "failed"},
	} {
		if got := guestCause(tc.err); got != tc.want {
			t.Errorf("guestCause(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
