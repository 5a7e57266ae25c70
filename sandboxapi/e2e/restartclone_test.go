package e2e_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// deadDaemon is the daemon's Proxmox client whose clone call, once the
// daemon is dead, starts the clone task on the emulator and then never
// returns (until stop is closed, at the test's end): the daemon died while
// qemu-server's clone ran on. While alive is set (aliveDaemon) clones run
// as usual; the zero value is dead from the start.
type deadDaemon struct {
	*pveapi.Client
	alive  atomic.Bool
	stop   chan struct{}
	cloned chan error // the dead clone call's own end
}

// aliveDaemon is a deadDaemon of px that lives until its alive is cleared.
func aliveDaemon(px *pveapi.Client) *deadDaemon {
	d := &deadDaemon{Client: px, stop: make(chan struct{}), cloned: make(chan error, 1)}
	d.alive.Store(true)
	return d
}

func (d *deadDaemon) CloneVM(ctx context.Context, s sandbox.CloneSpec) error {
	if d.alive.Load() {
		return d.Client.CloneVM(ctx, s)
	}
	res := make(chan error, 1)
	go func() { res <- d.Client.CloneVM(context.WithoutCancel(ctx), s) }()
	select {
	case err := <-res:
		if errors.Is(err, sandbox.ErrExists) {
			// another node's clone took the id first (the cluster's
			// daemons race for ids): the daemon is not dead until a
			// clone of its own runs; it tries the next id
			return err
		}
		d.cloned <- err
	case <-d.stop:
		return errors.New("the first daemon is gone")
	}
	<-d.stop
	return errors.New("the first daemon is gone")
}

// TestRestartMidCloneLeavesNothing: the daemon dies while a create's
// clone runs; the restarted daemon tears the sandbox down. The pool's
// token cannot see the clone yet (clone_vm adds the VM to the pool last,
// and the pool's grant reaches members only), so the VM reads as not
// found; the id is taken all the same (GET /cluster/nextid?vmid=N), so
// the teardown waits for the clone to land and deletes it, leaving no VM
// behind, not even one only root can see (issue 36 item 6).
func TestRestartMidCloneLeavesNothing(t *testing.T) {
	e := newEmuEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	held, release := e.emu.HoldClones()
	defer release()
	state := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts := func(p sandbox.Proxmox) sandbox.Options {
		return sandbox.Options{Node: "pve", Proxmox: p, Guests: socketGuests, QGADir: e.run, StateDir: state, AgentTimeout: 5 * time.Second, Logger: log}
	}
	dead := &deadDaemon{Client: e.px, stop: make(chan struct{}), cloned: make(chan error, 1)}
	first, err := sandbox.New(opts(dead))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	dieMidClone(t, ctx, first, dead, held, apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "vm0", Template: "debian"}}})
	// The restarted daemon; the clone ends a second after its reconcile
	// began.
	second, err := sandbox.New(opts(e.px))
	if err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(time.Second); release() }()
	if _, err := second.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if l := second.List(); len(l) != 0 {
		t.Errorf("sandboxes after the restart's teardown: %+v", l)
	}
	root := rootClient(t, e.emu, e.url, e.hc, "restart-test")
	vms, err := root.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vms {
		if !v.Template {
			t.Errorf("VM left after the restart (as root sees it): %+v", v)
		}
	}
	e.assertClean(t, ctx)
}

// dieMidClone has eng, whose Proxmox is dead (it dies at its next clone),
// create req, and returns once the emulator holds the create's clone: the
// daemon is gone mid-clone. The create stays blocked until the test ends.
// The token cannot see the clone in progress (clone_vm adds the VM to the
// pool last, and the pool's grant reaches members only).
func dieMidClone(t *testing.T, ctx context.Context, eng *sandbox.Engine, dead *deadDaemon, held <-chan int, req apitype.CreateRequest) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := eng.Create(context.WithoutCancel(ctx), req)
		t.Logf("the killed daemon's create: %v", err)
	}()
	t.Cleanup(func() { close(dead.stop); <-done })
	var vmid int
	select {
	case vmid = <-held:
	case err := <-dead.cloned:
		t.Fatalf("the clone ended before it was held: %v", err)
	case <-done:
		t.Fatal("the killed daemon's create ended before its clone started")
	case <-ctx.Done():
		t.Fatal("the clone never started")
	}
	if _, err := dead.Client.VM(ctx, vmid); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("the clone in progress as the token sees it: %v, want not found", err)
	}
}
