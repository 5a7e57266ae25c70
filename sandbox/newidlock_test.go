package sandbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
)

// lockedCloner is a node whose clone_vm task dies on a config lock it
// waited for past its 1 s timeout, as pveapi reports a failed task: the
// new id's (newLocked: a destroy of that id ending, the id already out of
// the cluster's vmlist) or the template's (srcLocked).
type lockedCloner struct {
	*apitest.Proxmox
	newLocked func(id int) bool
	srcLocked bool
	mu        sync.Mutex
	tried     []int
}

func (c *lockedCloner) CloneVM(ctx context.Context, s sandbox.CloneSpec) error {
	c.mu.Lock()
	c.tried = append(c.tried, s.NewID)
	c.mu.Unlock()
	locked := 0
	switch {
	case c.srcLocked:
		locked = s.Template
	case c.newLocked(s.NewID):
		locked = s.NewID
	default:
		return c.Proxmox.CloneVM(ctx, s)
	}
	return fmt.Errorf("clone %d to %d: task UPID:node1:0001:qmclone:%d:root@pam: (qmclone %d on node1) failed: can't lock file '/var/lock/qemu-server/lock-%d.conf' - got timeout",
		s.Template, s.NewID, s.Template, s.Template, locked)
}

// VMIDFree: a locked id is free in the cluster's vmlist.
func (c *lockedCloner) VMIDFree(_ context.Context, id int) (bool, error) {
	_, local := c.VMByID(id)
	return !local, nil
}

// TestCloneOfALockedNewIDTriesAnother: a clone that timed out on its new
// id's config lock made nothing (qemu-server clone_vm takes it before its
// worker writes anything), so the create tries another id and succeeds,
// with no VM left on the locked one; a create whose every id is locked
// gives up after a bounded number of clones; a timeout on the template's
// lock is no reason to change ids and fails the create at once.
func TestCloneOfALockedNewIDTriesAnother(t *testing.T) {
	for _, c := range []struct {
		name      string
		newLocked func(int) bool
		srcLocked bool
		ok        bool
		tries     int // clones sent, the first to 100
	}{
		{"new id locked", func(id int) bool { return id == 100 }, false, true, 2},
		{"every new id locked", func(int) bool { return true }, false, false, 8},
		{"template locked", func(int) bool { return false }, true, false, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			g := apitest.NewGuests()
			lc := &lockedCloner{Proxmox: apitest.NewProxmox(g, map[string]int{"debian": 9000}), newLocked: c.newLocked, srcLocked: c.srcLocked}
			e := nodeEngine(t, ctx, lc, g)
			sb, err := e.Create(ctx, oneVM("debian"))
			if (err == nil) != c.ok {
				t.Fatalf("create: %v, want success %v", err, c.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "got timeout") {
				t.Errorf("create failed with %v, want the lock's timeout", err)
			}
			lc.mu.Lock()
			tried := lc.tried
			lc.mu.Unlock()
			if len(tried) != c.tries || tried[0] != 100 {
				t.Errorf("clones sent to %v, want %d, the first to 100", tried, c.tries)
			}
			if c.ok && sb.VMs[0].VMID == 100 {
				t.Errorf("the sandbox's VM has the locked id 100")
			}
			for _, id := range tried {
				if _, ok := lc.VMByID(id); ok && (!c.ok || id != sb.VMs[0].VMID) {
					t.Errorf("VM %d left behind", id)
				}
			}
		})
	}
}
