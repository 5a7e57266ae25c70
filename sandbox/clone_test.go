package sandbox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
)

// crashingCloner is a Proxmox whose clone writes qemu-server's temporary
// config ("lock: clone", no name, no pool) and never returns: the daemon
// died while its clone task ran on.
type crashingCloner struct {
	*apitest.Proxmox
	cloning chan int
	stop    chan struct{} // closed when the test ends: the parked clone returns
}

func (c *crashingCloner) CloneVM(ctx context.Context, s sandbox.CloneSpec) error {
	c.AddVM(sandbox.VMInfo{VMID: s.NewID, Status: "stopped", Lock: "clone"})
	c.cloning <- s.NewID
	<-c.stop // the daemon is gone: nothing of it runs on until the test ends
	return errors.New("the first daemon is gone")
}

// TestReconcileWaitsForAbandonedClone: after a restart, reconcile tears
// down the sandbox caught mid-create; its VM is still being cloned
// (locked, without name or pool). The teardown must wait for the clone to
// end and then remove the VM by the name and pool it recorded, not leave
// it as foreign (issue 25, item 5).
func TestReconcileWaitsForAbandonedClone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := apitest.NewGuests()
	px := apitest.NewProxmox(g, map[string]int{"debian": 9000})
	state := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts := func(p sandbox.Proxmox) sandbox.Options {
		return sandbox.Options{Node: "node1", Proxmox: p, Guests: g.Dial, StateDir: state, AgentTimeout: 2 * time.Second, Logger: log}
	}
	cc := &crashingCloner{Proxmox: px, cloning: make(chan int, 1), stop: make(chan struct{})}
	first, err := sandbox.New(opts(cc))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	created := make(chan struct{})
	go func() { defer close(created); _, _ = first.Create(context.WithoutCancel(ctx), oneVM("debian")) }()
	t.Cleanup(func() { close(cc.stop); <-created }) // before the state directory goes
	var vmid int
	select {
	case vmid = <-cc.cloning:
	case <-ctx.Done():
		t.Fatal("the clone never started")
	}
	l := first.List()
	if len(l) != 1 {
		t.Fatalf("sandboxes of the first daemon: %+v", l)
	}
	// The restarted daemon. The clone ends a second later: qemu-server
	// drops the lock and adds the name and pool last.
	go func() {
		time.Sleep(time.Second)
		px.AddVM(sandbox.VMInfo{VMID: vmid, Status: "stopped", Name: "pvei-" + l[0].ID + "-vm0", Pool: "pve-inspect"})
	}()
	second, err := sandbox.New(opts(px))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := second.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.TornDown) != 1 || len(rep.Failed) != 0 {
		t.Errorf("reconcile report %+v, want the creating sandbox torn down", rep)
	}
	if ids := px.VMIDs(); slices.Contains(ids, vmid) {
		t.Fatalf("the abandoned clone %d is left (VMs %v)", vmid, ids)
	}
}
