package templatebuild

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandbox"
)

// statusUploader answers a storage's status (no upload).
type statusUploader struct{ st pveapi.StorageStatus }

func (u statusUploader) UploadFile(context.Context, string, pveapi.Upload, io.Reader) (string, error) {
	return "", errors.New("no upload here")
}

func (u statusUploader) StorageStatus(context.Context, string) (pveapi.StorageStatus, error) {
	return u.st, nil
}

// TestRoomHold: an upload is held only when the storage has room for it
// twice beyond what is held; a storage without room is full
// (sandbox.ErrStorageFull: 507), one that is not active is unavailable
// (sandbox.ErrNotConfigured: 503), not full, whatever its sizes say, and
// is named; neither refusal holds anything.
func TestRoomHold(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		st        pveapi.StorageStatus
		want, not error
		says      string
	}{
		{"room", pveapi.StorageStatus{Active: true, Total: 100, Avail: 20}, nil, nil, ""},
		{"no room", pveapi.StorageStatus{Active: true, Total: 100, Avail: 19}, sandbox.ErrStorageFull, sandbox.ErrNotConfigured, "has 19 bytes free"},
		{"inactive", pveapi.StorageStatus{}, sandbox.ErrNotConfigured, sandbox.ErrStorageFull, "the image storage fast is unavailable: it is not active on the node"},
		{"inactive, its sizes stale", pveapi.StorageStatus{Total: 100, Avail: 100}, sandbox.ErrNotConfigured, sandbox.ErrStorageFull, "unavailable"},
	} {
		r := &roomHolds{}
		release, err := r.hold(ctx, statusUploader{tc.st}, "fast", "x.ova", 10)
		if tc.want == nil {
			if err != nil || r.held["fast"] != 20 {
				t.Errorf("%s: %v, held %v", tc.name, err, r.held)
			}
			release()
			if len(r.held) != 0 {
				t.Errorf("%s: held %v after the release", tc.name, r.held)
			}
			continue
		}
		if !errors.Is(err, tc.want) || errors.Is(err, tc.not) || !strings.Contains(err.Error(), tc.says) || len(r.held) != 0 {
			t.Errorf("%s: %v (held %v), want %v saying %q, not %v", tc.name, err, r.held, tc.want, tc.says, tc.not)
		}
	}
}
