package pveapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// ImportMetadata is what Proxmox reads of an importable guest archive,
// an OVA in a storage's import directory (GET
// /nodes/{node}/storage/{storage}/import-metadata: pve-storage
// API2/Storage/Status.pm get_import_metadata, DirPlugin.pm
// get_import_metadata, GuestImport/OVF.pm parse_ovf). Proxmox parses the
// archive's .ovf in a forked child under a seccomp filter; nothing of
// the archive is parsed by this project.
type ImportMetadata struct {
	// CreateArgs are the VM settings the OVF gives, as text: name, cores,
	// memory, ostype (its OperatingSystemSection id mapped to qemu-server's
	// ostype, "other" when unknown), bios (ovmf for a VMware EFI guest)
	// and boot ("order=" the disks' keys in the OVF's order).
	CreateArgs map[string]string
	// Disks are the OVF's disks by the key Proxmox gives each: the bus of
	// its controller (ide, scsi, sata) and its address on it ("ide0",
	// "scsi1"). Two disks at one key keep the last (a map).
	Disks map[string]ImportDisk
	// EFI is set when the OVF asks for UEFI firmware (Proxmox's
	// disks.efidisk0, with the warning efi-state-lost).
	EFI bool
	// Warnings are Proxmox's warnings' types (ova-needs-extracting,
	// efi-state-lost, ...).
	Warnings []string
}

// ImportDisk is one disk of an importable archive.
type ImportDisk struct {
	// VolID is the disk as an import-from source: for an OVA
	// STORAGE:import/FILE.ova/MEMBER.
	VolID string
	// Size is its virtual size in bytes when the OVF says (0 when not).
	Size int64
}

// ImportMetadata asks Proxmox what the importable volume volid
// (STORAGE:import/FILE.ova) holds. The call needs read access to the
// volume (check_volume_access: Datastore.Allocate on the storage, or for
// an import volume Datastore.AllocateSpace or Datastore.Audit); Proxmox
// bounds its parse by 30 s.
func (c *Client) ImportMetadata(ctx context.Context, volid string) (ImportMetadata, error) {
	storage, volname, ok := strings.Cut(volid, ":")
	if !ok || storage == "" || volname == "" {
		return ImportMetadata{}, fmt.Errorf("import metadata of %q: want STORAGE:import/FILE", volid)
	}
	var raw importMetadataJSON
	p := fmt.Sprintf("/nodes/%s/storage/%s/import-metadata?volume=%s", url.PathEscape(c.node), url.PathEscape(storage), url.QueryEscape(volname))
	if err := c.c.Get(ctx, p, &raw); err != nil {
		return ImportMetadata{}, classify("import metadata of "+volid, err)
	}
	return raw.decode(volid)
}

// importMetadataJSON is import-metadata's answer as it comes: the
// create-args' values are Perl scalars (strings, or numbers), disks'
// values objects but efidisk0's, which is 1.
type importMetadataJSON struct {
	CreateArgs map[string]json.RawMessage `json:"create-args"`
	Disks      map[string]json.RawMessage `json:"disks"`
	Warnings   []struct {
		Type string `json:"type"`
	} `json:"warnings"`
}

func (raw importMetadataJSON) decode(volid string) (ImportMetadata, error) {
	md := ImportMetadata{CreateArgs: map[string]string{}, Disks: map[string]ImportDisk{}}
	for k, v := range raw.CreateArgs {
		var s string
		var n json.Number
		switch {
		case json.Unmarshal(v, &s) == nil:
			md.CreateArgs[k] = s
		case json.Unmarshal(v, &n) == nil:
			md.CreateArgs[k] = n.String()
		}
	}
	for k, v := range raw.Disks {
		var d struct {
			VolID string  `json:"volid"`
			Size  flexInt `json:"size"`
		}
		if err := json.Unmarshal(v, &d); err != nil || d.VolID == "" {
			// efidisk0: 1 (an EFI vars disk the import cannot bring)
			if k == "efidisk0" {
				md.EFI = true
				continue
			}
			return ImportMetadata{}, fmt.Errorf("import metadata of %s: disk %s: want an object with volid, got %s", volid, k, strconv.Quote(string(v)))
		}
		md.Disks[k] = ImportDisk{VolID: d.VolID, Size: int64(d.Size)}
	}
	for _, w := range raw.Warnings {
		md.Warnings = append(md.Warnings, w.Type)
	}
	return md, nil
}
