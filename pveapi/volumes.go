package pveapi

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/pve-inspect/pve-inspect/diskxfer"
)

// Volumes of a storage, used by the disk path for large transfers
// (diskxfer): a raw image is allocated on a storage, written on
// the node, hot-plugged into the VM and unplugged with force, which frees it.

var _ diskxfer.Lister = (*Client)(nil)

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

// DiskConfig returns a running VM's config as it runs (GET .../config
// with current=1) and as it will be with its pending changes (the default
// GET merges the pending values in and leaves out the keys whose deletion
// is pending: pve-guest-common load_current_config). qemu-server keeps a
// change it cannot hot-plug pending.
func (c *Client) DiskConfig(ctx context.Context, vmid int) (current, pending map[string]string, err error) {
	var cur, pend map[string]any
	if err := c.c.Get(ctx, c.qemu(vmid)+"/config?current=1", &cur); err != nil {
		return nil, nil, classify(fmt.Sprintf("read config of %d", vmid), err)
	}
	if err := c.c.Get(ctx, c.qemu(vmid)+"/config", &pend); err != nil {
		return nil, nil, classify(fmt.Sprintf("read pending config of %d", vmid), err)
	}
	return configTexts(cur), configTexts(pend), nil
}

// configTexts is a config as strings, without its digest.
func configTexts(m map[string]any) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		if k != "digest" {
			out[k] = configText(v)
		}
	}
	return out
}

// RunningQEMU returns the QEMU version a running VM uses (status/current's
// running-qemu, e.g. "10.1.2"): the machine version of an unpinned machine
// type.
func (c *Client) RunningQEMU(ctx context.Context, vmid int) (string, error) {
	var st struct {
		Status      string `json:"status"`
		RunningQEMU string `json:"running-qemu"`
	}
	if err := c.c.Get(ctx, c.qemu(vmid)+"/status/current", &st); err != nil {
		return "", classify(fmt.Sprintf("status of %d", vmid), err)
	}
	if st.RunningQEMU == "" {
		return "", fmt.Errorf("status of %d: no running-qemu (status %q)", vmid, st.Status)
	}
	return st.RunningQEMU, nil
}

// AttachVolume hot-plugs volid into the running VM as disk slot (e.g.
// "scsi5") with the given serial (needs VM.Config.Disk on the VM and
// Datastore.AllocateSpace on the storage). It uses the asynchronous POST
// .../config, a task the client waits for: the synchronous PUT does the
// hot-plug inside the HTTP request, which pveproxy cuts off after 30 s.
func (c *Client) AttachVolume(ctx context.Context, vmid int, slot, volid, serial string) error {
	return c.call(ctx, "POST", fmt.Sprintf("attach %s to %d", volid, vmid), c.qemu(vmid)+"/config",
		map[string]any{slot: volid + ",serial=" + serial})
}

// DetachVolume deletes disk slot with force: a plugged disk is unplugged
// and its volume freed, an unusedN's volume freed (qemu-server
// try_deallocate_drive: VM.Config.Disk, and Datastore.AllocateSpace on the
// storage of the VM's own volume). The asynchronous POST .../config, as
// AttachVolume.
func (c *Client) DetachVolume(ctx context.Context, vmid int, slot string) error {
	return c.call(ctx, "POST", fmt.Sprintf("detach %s of %d", slot, vmid), c.qemu(vmid)+"/config",
		map[string]any{"delete": slot, "force": 1})
}

// RevertPending drops the pending changes of VM vmid's config keys (POST
// .../config revert=keys; qemu-server update_vm: a key in the config gets
// its current value back, which cancels a pending deletion; a key only
// pending is deleted, and a disk's volume the VM owns becomes unusedN).
func (c *Client) RevertPending(ctx context.Context, vmid int, keys ...string) error {
	list := strings.Join(keys, ",")
	return c.call(ctx, "POST", fmt.Sprintf("revert %s of %d", list, vmid), c.qemu(vmid)+"/config",
		map[string]any{"revert": list})
}

// ImageVolumes lists storage's VM images on this node (GET
// .../storage/{storage}/content?content=images: Datastore.Audit on the
// storage, and each volume's check_volume_access). A storage not
// configured for images lists none.
func (c *Client) ImageVolumes(ctx context.Context, storage string) ([]diskxfer.Volume, error) {
	var list []struct {
		VolID string  `json:"volid"`
		VMID  flexInt `json:"vmid"`
	}
	if err := c.c.Get(ctx, c.storageContent(storage)+"?content=images", &list); err != nil {
		return nil, classify("list images of "+storage, err)
	}
	out := make([]diskxfer.Volume, 0, len(list))
	for _, v := range list {
		out = append(out, diskxfer.Volume{VolID: v.VolID, VMID: int(v.VMID)})
	}
	return out, nil
}
