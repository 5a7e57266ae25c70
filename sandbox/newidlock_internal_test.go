package sandbox

import (
	"errors"
	"testing"
)

// TestNewIDLocked: only the lock timeout of the clone's own new id reads
// as a contended id (another id is tried), not another VM's lock.
func TestNewIDLocked(t *testing.T) {
	for _, c := range []struct {
		err  error
		id   int
		want bool
	}{
		{errors.New("clone 9002 to 156: task failed: can't lock file '/var/lock/qemu-server/lock-156.conf' - got timeout"), 156, true},
		{errors.New("can't lock file '/var/lock/qemu-server/lock-9002.conf' - got timeout"), 156, false},
		{errors.New("can't lock file '/var/lock/qemu-server/lock-1560.conf' - got timeout"), 156, false},
		{nil, 156, false},
	} {
		if got := newIDLocked(c.err, c.id); got != c.want {
			t.Errorf("newIDLocked(%v, %d) = %v, want %v", c.err, c.id, got, c.want)
		}
	}
}
