package diskxfer

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
)

// lateAttachPx is fakePx whose hot-plug task outlives the client's wait:
// pveapi's wait returns ctx.Err() as soon as the caller's context ends
// (the API client hung up, a delete cancelled the operation), while
// qemu-server's qmconfig worker goes on and writes the disk into the VM's
// config (update_vm_api: pending, then vmconfig_hotplug_pending) after the
// daemon's next read of it. A read of the config takes no config lock
// (vm_config: load_current_config), so it sees the state of the moment.
type lateAttachPx struct {
	*fakePx
	cancel  context.CancelFunc // the upload's caller going away
	landing map[string]string  // what the still-running task writes next
}

func (l *lateAttachPx) AttachVolume(ctx context.Context, vmid int, slot, volid, serial string) error {
	l.calls = append(l.calls, "attach "+slot)
	l.init()
	l.cancel()
	if err := ctx.Err(); err != nil {
		// the client stops waiting; the task is still running
		l.landing = map[string]string{slot: volid + ",serial=" + serial}
		return fmt.Errorf("attach %s of %d: %w", slot, vmid, err)
	}
	l.conf[slot] = volid + ",serial=" + serial
	return nil
}

func (l *lateAttachPx) DiskConfig(ctx context.Context, vmid int) (map[string]string, map[string]string, error) {
	cur, pend, err := l.fakePx.DiskConfig(ctx, vmid)
	for k, v := range l.landing { // the task writes right after this read
		l.conf[k] = v
	}
	l.landing = nil
	return cur, pend, err
}

// TestCancelledAttachNeverFreesANamedImage: an upload whose caller goes
// away while the hot-plug task runs must not free the image the task is
// about to name in the VM's config: the VM's next start (and a rollback)
// would fail on the missing volume, which is what the issue-36 cleanup
// set out to prevent. Fails today: cleanup's release reads the config
// before the task wrote it, finds no key, and frees the image through the
// storage.
func TestCancelledAttachNeverFreesANamedImage(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	px := &lateAttachPx{fakePx: &fakePx{dir: t.TempDir()}, cancel: cancel}
	g := &fakeGuest{err: context.Canceled}
	_ = New(px, Options{}).Upload(ctx, 100, g, "/f", strings.NewReader("x"), 1, 0o644)
	ents, _ := os.ReadDir(px.dir)
	if refs := px.imageRefs(); len(refs) != 0 && len(ents) == 0 {
		t.Fatalf("the image was freed while the VM's config names it in %v (calls %v)", refs, px.calls)
	}
}
