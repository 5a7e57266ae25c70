package templatebuild

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/pveapi"
)

// TestOVADiskOrder: the disks import-metadata lists are imported in the
// OVF's order (its boot order), then any other by bus and number; an OVF
// with no disk, two disks at one key, or UEFI firmware is refused.
func TestOVADiskOrder(t *testing.T) {
	d := func(keys ...string) map[string]pveapi.ImportDisk {
		m := map[string]pveapi.ImportDisk{}
		for _, k := range keys {
			m[k] = pveapi.ImportDisk{VolID: "local:import/x.ova/" + k + ".vmdk"}
		}
		return m
	}
	for _, tt := range []struct {
		name string
		md   pveapi.ImportMetadata
		want []string
		err  string
	}{
		{"boot order", pveapi.ImportMetadata{CreateArgs: map[string]string{"boot": "order=scsi1;ide0;scsi0"}, Disks: d("scsi0", "scsi1", "ide0")}, []string{"scsi1", "ide0", "scsi0"}, ""},
		{"no boot order", pveapi.ImportMetadata{Disks: d("scsi10", "scsi2", "ide1", "sata0")}, []string{"ide1", "sata0", "scsi2", "scsi10"}, ""},
		{"partial boot order", pveapi.ImportMetadata{CreateArgs: map[string]string{"boot": "order=sata1"}, Disks: d("sata0", "sata1", "0")}, []string{"sata1", "0", "sata0"}, ""},
		{"no disk", pveapi.ImportMetadata{}, nil, "lists no disk"},
		{"two disks at one key", pveapi.ImportMetadata{CreateArgs: map[string]string{"boot": "order=scsi0;scsi0"}, Disks: d("scsi0")}, nil, "two disks at scsi0"},
		{"uefi", pveapi.ImportMetadata{EFI: true, Disks: d("scsi0")}, nil, "UEFI"},
	} {
		got, err := ovaDiskOrder(tt.md)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: %v %v, want %q", tt.name, got, err, tt.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v %v, want %v", tt.name, got, err, tt.want)
		}
	}
}

// TestImportSourcesRefuseForeignMembers: a disk import-metadata names
// outside the OVA built from, or with a name this build does not pass to
// import-from (white space, another extension), is refused.
func TestImportSourcesRefuseForeignMembers(t *testing.T) {
	for _, volid := range []string{"local:import/other.ova/a.vmdk", "local:import/x.ova/a b.vmdk", "local:import/x.ova/a.iso", "local:import/x.ova/sub/a.vmdk"} {
		px := newFakePVE()
		px.metadata = map[string]pveapi.ImportMetadata{"local:import/x.ova": {Disks: map[string]pveapi.ImportDisk{"ide0": {VolID: volid}}}}
		b := &Builder{px: px, o: Options{Recipe: Generic(Image{Volume: "local:import/x.ova", File: "x.ova"}), Mode: Mode{ImportOnly: true, DiskBus: BusIDE, OSType: "l26"}}}
		b.o.defaults()
		if got, err := b.importSources(context.Background(), source{importFrom: "local:import/x.ova"}); err == nil || !strings.Contains(err.Error(), "not a disk image of the archive") {
			t.Errorf("%s: %v %v, want refused", volid, got, err)
		}
	}
}
