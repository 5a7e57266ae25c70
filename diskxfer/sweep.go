package diskxfer

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// Volume is a VM image on a storage as Proxmox lists it.
type Volume struct {
	VolID string
	VMID  int
}

// Lister lists a storage's VM images (pveapi: GET
// /nodes/{node}/storage/{storage}/content?content=images). A storage not
// configured for images lists none (pve-storage volume_list).
type Lister interface {
	ImageVolumes(ctx context.Context, storage string) ([]Volume, error)
}

// reTransferImage is the name setupLocked gives a transfer image, after
// the storage's prefix ("local:100/" on a dir storage).
var reTransferImage = regexp.MustCompile(`^vm-(\d+)-pvei-[0-9a-f]{12}\.raw$`)

// SweepReport is what Sweep found and did.
type SweepReport struct {
	// Freed are the images freed (detached first where a VM still had
	// one); Left the ones left alone, each with why.
	Freed []string
	Left  []string
}

// Sweep frees the transfer images a daemon that stopped mid-transfer left
// on the storage: each image of the transfer name whose owner VM is on
// this node (its config reads) and holds no transfer of this daemon now.
// One still plugged into the VM is unplugged (DetachVolume frees it), one
// a failed hot-plug left pending is reverted first, one the VM keeps as
// unusedN is deleted there; one
// whose VM this node cannot read (gone, or another node's on a shared
// storage) is left and named, as is one whose VM's config cannot be read
// for another reason. Run it when no transfer can be running (at start).
func (t *Transfer) Sweep(ctx context.Context) (SweepReport, error) {
	var rep SweepReport
	l, ok := t.px.(Lister)
	if !ok {
		return rep, errors.New("disk transfer sweep: the Proxmox client cannot list a storage's images")
	}
	vols, err := l.ImageVolumes(ctx, t.o.Storage)
	if err != nil {
		return rep, fmt.Errorf("disk transfer sweep: list %s: %w", t.o.Storage, err)
	}
	var errs []error
	for _, v := range vols {
		name := v.VolID
		if i := strings.LastIndexAny(name, ":/"); i >= 0 {
			name = name[i+1:]
		}
		m := reTransferImage.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		if owner, _ := strconv.Atoi(m[1]); owner != v.VMID && v.VMID != 0 {
			rep.Left = append(rep.Left, fmt.Sprintf("%s: owner %d, named for %d", v.VolID, v.VMID, owner))
			continue
		}
		if err := t.sweepOne(ctx, v); err != nil {
			if errors.Is(err, errLeave) {
				rep.Left = append(rep.Left, err.Error())
				continue
			}
			errs = append(errs, err)
			continue
		}
		rep.Freed = append(rep.Freed, v.VolID)
	}
	return rep, errors.Join(errs...)
}

// errLeave marks an image Sweep leaves alone.
var errLeave = errors.New("left alone")

// sweepOne frees one leftover image of VM v.VMID, under the VM's transfer
// lock, the way a transfer's cleanup does (release: pending references
// reverted first, a plugged one unplugged, an unusedN deleted).
func (t *Transfer) sweepOne(ctx context.Context, v Volume) error {
	unlock, err := t.lockVM(ctx, v.VMID)
	if err != nil {
		return err
	}
	defer unlock()
	switch _, _, err := t.px.DiskConfig(ctx, v.VMID); {
	case errors.Is(err, sandbox.ErrNotFound):
		return fmt.Errorf("%s: VM %d is not on this node: %w", v.VolID, v.VMID, errLeave)
	case err != nil:
		return fmt.Errorf("%s: VM %d's config: %v: %w", v.VolID, v.VMID, err, errLeave)
	}
	if err := t.release(ctx, v.VMID, v.VolID, detachTries); err != nil {
		return fmt.Errorf("disk transfer sweep: %w", err)
	}
	return nil
}
