package diskxfer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// listingPx is fakePx with the storage's image list, each image owned by
// the VM its name says, and VMs this node cannot read.
type listingPx struct {
	*fakePx
	gone map[int]bool
}

func (l *listingPx) ImageVolumes(ctx context.Context, storage string) ([]Volume, error) {
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, err
	}
	var out []Volume
	for _, e := range ents {
		var vmid int
		if f := strings.SplitN(e.Name(), "-", 3); len(f) == 3 {
			vmid, _ = strconv.Atoi(f[1])
		}
		out = append(out, Volume{VolID: storage + ":" + e.Name(), VMID: vmid})
	}
	return out, nil
}

// DetachVolume unplugs slot, freeing the image plugged there (only that
// one).
func (l *listingPx) DetachVolume(ctx context.Context, vmid int, slot string) error {
	l.calls = append(l.calls, "detach "+slot)
	volid, _, _ := strings.Cut(l.conf[slot], ",")
	_, name, _ := strings.Cut(volid, ":")
	delete(l.conf, slot)
	return os.Remove(filepath.Join(l.dir, name))
}

func (l *listingPx) DiskConfig(ctx context.Context, vmid int) (map[string]string, map[string]string, error) {
	if l.gone[vmid] {
		return nil, nil, fmt.Errorf("vm %d: %w", vmid, sandbox.ErrNotFound)
	}
	return l.fakePx.DiskConfig(ctx, vmid)
}

// TestSweep: at start, transfer images a stopped daemon left are freed
// (unplugged first when the VM still has one, reverted first when a
// failed hot-plug left it pending, deleted as unusedN when the VM keeps it
// so): no key of the config names a freed image; images of other names, of
// a VM this node cannot read, or named for another VM than their owner
// are left and named.
func TestSweep(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{
		"vm-100-pvei-0123456789ab.raw", // leftover, not plugged
		"vm-101-pvei-aaaaaaaaaaaa.raw", // still plugged as scsi5
		"vm-100-disk-0.raw",            // a VM's own disk
		"vm-102-pvei-bbbbbbbbbbbb.raw", // its VM is not on this node
		"vm-100-pvei-short.raw",        // not the transfer name
		"vm-100-pvei-cccccccccccc.raw", // pending as scsi7 (a failed hot-plug)
		"vm-100-pvei-dddddddddddd.raw", // unused0
	} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f := &fakePx{dir: dir, conf: map[string]string{"scsi0": "local-lvm:vm-1-disk-0", "scsi5": "local:vm-101-pvei-aaaaaaaaaaaa.raw,serial=pveiaaaaaaaaaaaa",
		"unused0": "local:vm-100-pvei-dddddddddddd.raw"},
		pend: map[string]string{"scsi7": "local:vm-100-pvei-cccccccccccc.raw,serial=pveicccccccccccc"}}
	lp := &listingPx{fakePx: f, gone: map[int]bool{102: true}}
	tr := New(lp, Options{Storage: "local"})
	rep, err := tr.Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"local:vm-100-pvei-0123456789ab.raw", "local:vm-100-pvei-cccccccccccc.raw", "local:vm-100-pvei-dddddddddddd.raw", "local:vm-101-pvei-aaaaaaaaaaaa.raw"}; !slices.Equal(rep.Freed, want) {
		t.Errorf("freed %v, want %v", rep.Freed, want)
	}
	if len(rep.Left) != 1 || !strings.Contains(rep.Left[0], "vm-102-pvei-bbbbbbbbbbbb.raw: VM 102 is not on this node") {
		t.Errorf("left %v", rep.Left)
	}
	if want := []string{"free", "revert scsi7", "detach unused1", "detach unused0", "detach scsi5"}; !slices.Equal(f.calls, want) {
		t.Errorf("calls %v, want %v: the leftover freed, the pending one reverted and freed as unused1, unused0 deleted, the plugged one unplugged", f.calls, want)
	}
	if refs := f.imageRefs(); len(refs) != 0 {
		t.Errorf("config still names %v", refs)
	}
	ents, _ := os.ReadDir(dir)
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if want := []string{"vm-100-disk-0.raw", "vm-100-pvei-short.raw", "vm-102-pvei-bbbbbbbbbbbb.raw"}; !slices.Equal(left, want) {
		t.Errorf("images left %v, want %v", left, want)
	}
}

// TestSweepNeedsALister: a client that cannot list images is an error,
// not a silent no-op.
func TestSweepNeedsALister(t *testing.T) {
	if _, err := New(&fakePx{dir: t.TempDir()}, Options{}).Sweep(context.Background()); err == nil {
		t.Fatal("no error")
	}
}
