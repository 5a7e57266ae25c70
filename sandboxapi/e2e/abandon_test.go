package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestEmulatorCancelledCreateMidClone: the client goes away while the
// clone task runs. qemu-server's clone_vm runs on, writes the name, and
// adds the VM to the pool only at its end; the daemon must not tear down
// before it and leave an untagged VM behind (issue 25, item 5).
func TestEmulatorCancelledCreateMidClone(t *testing.T) {
	e := newEmuEnv(t, [][2]string{{"/", "Administrator"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	held, release := e.emu.HoldClones()
	defer release()
	cctx, ccancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := e.c.Create(cctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
		done <- err
	}()
	var vmid int
	select {
	case vmid = <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the clone never started")
	}
	ccancel()
	if err := <-done; err == nil {
		t.Fatal("a cancelled create succeeded")
	}
	// Give a teardown that does not wait for the clone the time to run
	// (and miss the VM), then let the clone finish.
	gone := func() bool {
		l, err := e.c.List(ctx)
		return err == nil && len(l) == 0
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end) && !gone(); {
		time.Sleep(50 * time.Millisecond)
	}
	release()
	for end := time.Now().Add(30 * time.Second); !gone(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the cancelled sandbox is still listed 30 s after its clone ended")
		}
	}
	// The clone task is over on either path: wait for it, then nothing of
	// ours may be left.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if info, err := e.px.VM(ctx, vmid); err != nil || info.Lock == "" {
			break
		}
	}
	e.assertClean(t, ctx)
}
