package sandbox

import (
	"errors"
	"testing"
)

// TestVMBusy: transfers run beside transfers and snapshots beside
// snapshots (each has its own serialization), but not one kind beside the
// other on the same VM; ending the work frees the VM.
func TestVMBusy(t *testing.T) {
	var b vmBusy
	t1, err := b.begin(1, busyTransfer)
	if err != nil {
		t.Fatal(err)
	}
	t2, err := b.begin(1, busyTransfer)
	if err != nil {
		t.Fatalf("second transfer: %v", err)
	}
	if _, err := b.begin(1, busySnapshot); !errors.Is(err, ErrConflict) {
		t.Fatalf("snapshot during transfers: %v", err)
	}
	s2, err := b.begin(2, busySnapshot)
	if err != nil {
		t.Fatalf("snapshot of another VM: %v", err)
	}
	t1()
	if _, err := b.begin(1, busySnapshot); !errors.Is(err, ErrConflict) {
		t.Fatalf("snapshot with one transfer left: %v", err)
	}
	t2()
	s1, err := b.begin(1, busySnapshot)
	if err != nil {
		t.Fatalf("snapshot after the transfers: %v", err)
	}
	if _, err := b.begin(1, busyTransfer); !errors.Is(err, ErrConflict) {
		t.Fatalf("transfer during a snapshot: %v", err)
	}
	s1()
	s2()
	if len(b.by) != 0 {
		t.Fatalf("state left: %v", b.by)
	}
}
