package doctor

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// contentReach says, per storage content type, what the transfer grant
// (Datastore.Allocate on the storage) lets a holder of the token do with
// that content: pve-storage's check_volume_access returns early for
// Datastore.Allocate, so GET .../content/{volume} reads any volume's path,
// a drive value may name it (update_vm's check_storage_access), and
// Content.pm's delete frees it (a backup whose VM exists needs VM.Backup
// on it as well).
var contentReach = map[string]string{
	"iso":      "ISO images (attach one to a pool VM, delete it)",
	"vztmpl":   "container templates (delete them)",
	"backup":   "backups (delete those whose name carries no VM id)",
	"snippets": "snippets, i.e. hook scripts and cloud-init files (delete them)",
	"import":   "import volumes (attach one to a pool VM, delete it)",
	"rootdir":  "container volumes (delete them)",
}

// TransferStorageCheck checks the transfer storage's content types
// ([api] disk_transfer_storage; skipped when the disk path is off). It
// fails when images is not among them: pve-storage lists a storage's
// volumes only for its configured content types (Storage.pm volume_list),
// so a transfer image a crash leaks there is invisible to the daemon's
// sweep, to the doctor's leftover check and to Proxmox itself. It warns
// when the storage holds more than images: the transfer role's
// Datastore.Allocate (pve-access-setup, to free a leaked image) reaches
// every volume there. A warning, not a failure: transfers work, only a
// holder of the token's secret (root-readable on the node, never a guest)
// gets that reach, and a fresh node's one directory storage, local, holds
// ISOs, templates and backups.
func TransferStorageCheck(px API, n Node) Check {
	return Check{Name: "transfer storage content", Run: func(ctx context.Context) Outcome {
		id := n.TransferStorage
		if id == "" {
			return skipf("no transfer storage ([api] disk_transfer_storage is unset): the disk path is off and pve-access-setup grants no storage")
		}
		s, err := readStorage(ctx, px, id)
		if err != nil {
			return failf(fmt.Sprintf("define storage %s, or change [api] disk_transfer_storage", id), "%v", err)
		}
		dedicated := fmt.Sprintf("give the transfer images a storage of their own with content images only (pvesm add dir pvei-xfer --path /var/lib/pve-inspect-xfer --content images, [api] disk_transfer_storage = \"pvei-xfer\", pve-access-setup again, and the unit's transfer-storage.conf drop-in for its path), or take the other content types off %s", id)
		if !s.hasContent("images") {
			return failf(fmt.Sprintf("pvesm set %s --content %s; better: %s", id, strings.TrimPrefix(s.Content+",images", ","), dedicated),
				"%s (%s) has content %q, without images: Proxmox lists a storage's volumes only for its configured content types (pve-storage volume_list), so a transfer image a crash leaks there is invisible to the daemon's sweep, to the doctor's leftover check and to Proxmox itself (qm disk rescan, a destroy's unreferenced disks), and stays until someone deletes it by hand",
				id, s.Type, s.Content)
		}
		var others []string
		for _, c := range strings.Split(s.Content, ",") {
			if c == "" || c == "images" {
				continue
			}
			what := contentReach[c]
			if what == "" {
				what = c + " volumes"
			}
			others = append(others, what)
		}
		slices.Sort(others)
		if len(others) > 0 {
			return warnf(dedicated,
				"%s (%s) has content %q: the token's Datastore.Allocate there (the transfer role, to free leaked images) makes pve-storage's check_volume_access pass for every volume on it, so whoever holds the token reaches %s, besides other VMs' disk images kept there. Transfers work: a warning, since only a holder of the token's secret gets this reach",
				id, s.Type, s.Content, strings.Join(others, "; "))
		}
		return passf("%s (%s): content images only: leaked transfer images are listed, and the token's Datastore.Allocate reaches VM images alone (keep other VMs' disks off it)", id, s.Type)
	}}
}
