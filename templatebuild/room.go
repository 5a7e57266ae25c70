package templatebuild

import (
	"context"
	"fmt"
	"sync"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// roomHolds is, per image storage, the room the uploads sending to it
// now were checked for (uploadSpoolCopies times each one's size), each
// held until its upload ends: the Service's uploads (Upload) and the
// archive uploads of the builds it runs (unpack.go) share one, so that
// two uploads at once that each fit alone but not together are not both
// sent. A build outside a Service (the CLI) has one of its own.
type roomHolds struct {
	// The mutex protects held; a leaf (nothing is called out while it is
	// held).
	mu   sync.Mutex
	held map[string]int64
}

// hold refuses an upload of size bytes to storage unless the storage has
// uploadSpoolCopies times that free (its status on the node) beyond the
// room the uploads to it in flight were checked for, and holds that room
// until release. The status taken while an upload runs already counts
// what it has written, so the hold errs on the side of a refusal (an
// error wrapping sandbox.ErrStorageFull, naming the storage, the need
// and what is free: retry once it ended). A storage that is not active
// (its status' active 0: disabled, limited to other nodes, or Proxmox could not activate it, a mount or a
// server gone) is unavailable, not full: an error wrapping
// sandbox.ErrNotConfigured (the API's unavailable) naming it. what names
// the upload in the refusal.
func (r *roomHolds) hold(ctx context.Context, up Uploader, storage, what string, size int64) (release func(), err error) {
	st, err := up.StorageStatus(ctx, storage)
	if err != nil {
		return nil, fmt.Errorf("room on the image storage %s: %w", storage, err)
	}
	need := uploadSpoolCopies * size
	if !st.Active {
		return nil, unavailable{fmt.Sprintf("the image storage %s is unavailable: it is not active on the node (pvesm status --storage %s: disabled, limited to other nodes, or Proxmox could not activate it: is its mount or server there?), so the upload of %s (%d bytes) was not sent: retry once it is active",
			storage, storage, what, size)}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	held := r.held[storage]
	if st.Avail-held < need {
		inFlight := ""
		if held > 0 {
			inFlight = fmt.Sprintf(", %d of them held by the uploads to it in flight", held)
		}
		return nil, fmt.Errorf("%w: the image storage %s has %d bytes free (of %d)%s; the upload of %s (%d bytes) needs %d (Proxmox spools it to /var/tmp, then copies it into the storage): free room there, or retry once the uploads in flight ended: nothing was sent",
			sandbox.ErrStorageFull, storage, st.Avail, st.Total, inFlight, what, size, need)
	}
	if r.held == nil {
		r.held = map[string]int64{}
	}
	r.held[storage] = held + need
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.held[storage] -= need; r.held[storage] == 0 {
			delete(r.held, storage)
		}
	}, nil
}

// unavailable is a refusal for want of a part of the node (an inactive
// storage): its message alone, and errors.Is sandbox.ErrNotConfigured
// (the API's unavailable, 503).
type unavailable struct{ msg string }

func (e unavailable) Error() string { return e.msg }
func (e unavailable) Unwrap() error { return sandbox.ErrNotConfigured }
