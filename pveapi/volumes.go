package pveapi

import (
	"context"
	"fmt"
	"net/url"
	"strings"
)

// Volumes of a storage, used by the disk path for large transfers
// (diskxfer): a raw image is allocated on a storage, written on
// the node, hot-plugged into the VM and unplugged with force, which frees it.

func (c *Client) storageContent(storage string) string {
	return fmt.Sprintf("/nodes/%s/storage/%s/content", url.PathEscape(c.node), url.PathEscape(storage))
}

// AllocVolume allocates a raw image named name (vm-<vmid>-*.raw) owned by
// vmid on storage, at least size bytes (rounded up to KiB), and returns
// its volume id. Needs Datastore.AllocateSpace on the storage.
func (c *Client) AllocVolume(ctx context.Context, storage string, vmid int, name string, size int64) (string, error) {
	if size < 0 {
		return "", fmt.Errorf("allocate %s: negative size", name)
	}
	kib := max((size+1023)/1024, 1)
	var volid string
	body := map[string]any{"filename": name, "vmid": vmid, "size": fmt.Sprint(kib), "format": "raw"}
	if err := c.c.Post(ctx, c.storageContent(storage), body, &volid); err != nil {
		return "", classify("allocate "+name, err)
	}
	if !strings.HasPrefix(volid, storage+":") {
		return "", fmt.Errorf("allocate %s: unexpected volume id %q", name, volid)
	}
	return volid, nil
}

// VolumePath returns the node path of a volume (needs read access to it:
// Datastore.Allocate on the storage, or Datastore.Audit on it and
// VM.Config.Disk on the owner).
func (c *Client) VolumePath(ctx context.Context, volid string) (string, error) {
	storage, _, ok := strings.Cut(volid, ":")
	if !ok {
		return "", fmt.Errorf("volume %q has no storage", volid)
	}
	var info struct {
		Path string `json:"path"`
	}
	if err := c.c.Get(ctx, c.storageContent(storage)+"/"+url.PathEscape(volid), &info); err != nil {
		return "", classify("path of "+volid, err)
	}
	if !strings.HasPrefix(info.Path, "/") {
		return "", fmt.Errorf("path of %s: not an absolute path: %q", volid, info.Path)
	}
	return info.Path, nil
}

// FreeVolume deletes a volume that no VM config refers to (needs
// Datastore.Allocate on the storage).
func (c *Client) FreeVolume(ctx context.Context, volid string) error {
	storage, _, ok := strings.Cut(volid, ":")
	if !ok {
		return fmt.Errorf("volume %q has no storage", volid)
	}
	return c.call(ctx, "DELETE", "free "+volid, c.storageContent(storage)+"/"+url.PathEscape(volid), nil)
}

// DiskKeys returns the VM's config keys (to pick a free disk slot).
func (c *Client) DiskKeys(ctx context.Context, vmid int) (map[string]bool, error) {
	cfg, err := c.config(ctx, vmid)
	if err != nil {
		return nil, err
	}
	keys := make(map[string]bool, len(cfg))
	for k := range cfg {
		keys[k] = true
	}
	return keys, nil
}

// AttachVolume hot-plugs volid into the running VM as disk slot (e.g.
// "scsi5") with the given serial (needs VM.Config.Disk on the VM and
// Datastore.AllocateSpace on the storage).
func (c *Client) AttachVolume(ctx context.Context, vmid int, slot, volid, serial string) error {
	return c.call(ctx, "PUT", fmt.Sprintf("attach %s to %d", volid, vmid), c.qemu(vmid)+"/config",
		map[string]any{slot: volid + ",serial=" + serial})
}

// DetachVolume unplugs disk slot with force, which also frees its volume.
func (c *Client) DetachVolume(ctx context.Context, vmid int, slot string) error {
	return c.call(ctx, "PUT", fmt.Sprintf("detach %s of %d", slot, vmid), c.qemu(vmid)+"/config",
		map[string]any{"delete": slot, "force": 1})
}
