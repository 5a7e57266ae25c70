package sandbox_test

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// heldTransfer is a DiskTransfer whose uploads run until release closes.
type heldTransfer struct {
	started chan struct{}
	release chan struct{}
}

func (h *heldTransfer) Upload(ctx context.Context, vmid int, g sandbox.Guest, path string, r io.Reader, size int64, mode os.FileMode) error {
	h.started <- struct{}{}
	<-h.release
	return nil
}

func (h *heldTransfer) Download(ctx context.Context, vmid int, g sandbox.Guest, path string, size int64, w io.Writer) (int64, error) {
	return 0, nil
}

// TestSnapshotDuringDiskTransfer: a snapshot or rollback of a VM while a
// disk transfer runs on it is refused as a conflict (its fsfreeze would
// stall the transfer, a raw transfer image refuses the snapshot), and
// works once the transfer has ended; another VM is not held up.
func TestSnapshotDuringDiskTransfer(t *testing.T) {
	ctx := context.Background()
	ht := &heldTransfer{started: make(chan struct{}, 1), release: make(chan struct{})}
	e := newEngine(t, func(o *sandbox.Options) { o.DiskTransfer = ht; o.DiskThreshold = 1 })
	sb, err := e.Create(ctx, oneVM("debian"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.Create(ctx, oneVM("debian"))
	if err != nil {
		t.Fatal(err)
	}
	vmid := sb.VMs[0].VMID
	errc := make(chan error, 1)
	go func() { errc <- e.Upload(ctx, vmid, "/root/f", strings.NewReader("xy"), 2, 0o644) }()
	select {
	case <-ht.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the transfer never started")
	}
	for name, op := range map[string]func() error{
		"snapshot": func() error { return e.Snapshot(ctx, vmid, "s1") },
		"rollback": func() error { return e.Rollback(ctx, vmid, "s1") },
	} {
		if err := op(); !errors.Is(err, sandbox.ErrConflict) || !strings.Contains(err.Error(), "disk transfer") {
			t.Errorf("%s during a disk transfer: %v, want a conflict naming the transfer", name, err)
		}
	}
	if err := e.Snapshot(ctx, other.VMs[0].VMID, "s1"); err != nil {
		t.Errorf("snapshot of another VM during the transfer: %v", err)
	}
	close(ht.release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if err := e.Snapshot(ctx, vmid, "s1"); err != nil {
		t.Fatalf("snapshot after the transfer: %v", err)
	}
}
