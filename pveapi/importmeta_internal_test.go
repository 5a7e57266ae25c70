package pveapi

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// TestImportMetadataDecode: import-metadata's answer as pve-storage
// writes it (DirPlugin.pm get_import_metadata): create-args' values are
// strings or numbers, each disk an object with volid and size but
// efidisk0, which is 1 for an OVMF guest; anything else is an error.
func TestImportMetadataDecode(t *testing.T) {
	body := `{"type":"vm","source":"import/w.ova","create-args":{"name":"w","cores":"2","memory":4096,"ostype":"win10","bios":"ovmf","boot":"order=scsi0;scsi1"},
		"disks":{"scsi0":{"volid":"local:import/w.ova/a.vmdk","size":8589934592},"scsi1":{"volid":"local:import/w.ova/b.vmdk"},"efidisk0":1},
		"warnings":[{"type":"ova-needs-extracting"},{"type":"efi-state-lost","key":"bios","value":"ovmf"}],"net":{"net0":{"model":"e1000"}}}`
	var raw importMetadataJSON
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatal(err)
	}
	md, err := raw.decode("local:import/w.ova")
	if err != nil {
		t.Fatal(err)
	}
	want := ImportMetadata{
		CreateArgs: map[string]string{"name": "w", "cores": "2", "memory": "4096", "ostype": "win10", "bios": "ovmf", "boot": "order=scsi0;scsi1"},
		Disks:      map[string]ImportDisk{"scsi0": {VolID: "local:import/w.ova/a.vmdk", Size: 8 << 30}, "scsi1": {VolID: "local:import/w.ova/b.vmdk"}},
		EFI:        true,
		Warnings:   []string{"ova-needs-extracting", "efi-state-lost"},
	}
	if !reflect.DeepEqual(md, want) {
		t.Errorf("decoded %+v\nwant %+v", md, want)
	}
	if err := json.Unmarshal([]byte(`{"disks":{"ide0":"local:import/x.ova/a.vmdk"}}`), &raw); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.decode("local:import/x.ova"); err == nil || !strings.Contains(err.Error(), "disk ide0: want an object with volid") {
		t.Errorf("a disk that is no object: %v", err)
	}
}
