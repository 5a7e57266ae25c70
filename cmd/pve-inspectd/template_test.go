package main

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
)

// fakeConfigs is a VM config store that refuses root-only keys unless
// root, like qemu-server does for a token.
type fakeConfigs struct {
	conf map[int]map[string]string
	root bool
}

func (f *fakeConfigs) VMConfig(_ context.Context, vmid int) (map[string]string, error) {
	c, ok := f.conf[vmid]
	if !ok {
		return nil, errors.New("no such vm")
	}
	return maps.Clone(c), nil
}

func (f *fakeConfigs) UpdateVMConfig(_ context.Context, vmid int, set map[string]string, del []string) error {
	for _, k := range del {
		if (k == "args" || strings.HasPrefix(k, "hostpci")) && !f.root {
			return errors.New("only root can set '" + k + "' config")
		}
		delete(f.conf[vmid], k)
	}
	maps.Copy(f.conf[vmid], set)
	return nil
}

func TestTemplateCheckAndHarden(t *testing.T) {
	dirty := map[string]string{"template": "1", "args": "-device x", "hostpci0": "0000:01:00.0", "vga": "std", "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0",
		"scsi0": "local-lvm:base-9000-disk-0,size=8G"} // scsihw unset: lsi
	for _, tc := range []struct {
		name     string
		root     bool
		wantErr  string
		wantText []string
	}{
		{"root hardens", true, "", []string{"deleted args", "deleted hostpci0", "set scsihw = virtio-scsi-single", "needs the virtio-scsi driver", "set vga = serial0", "hardened: creates may clone it"}},
		{"token refused", false, "only root can set 'args'", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeConfigs{conf: map[int]map[string]string{9000: maps.Clone(dirty), 100: {"vga": "std"}}, root: tc.root}
			var buf bytes.Buffer
			rep, err := templateReport(context.Background(), f, 9000)
			if err != nil {
				t.Fatal(err)
			}
			writeReport(&buf, 9000, rep)
			if !strings.Contains(buf.String(), "NOT hardened: 3 item(s)") {
				t.Fatalf("check of the dirty template:\n%s", buf.String())
			}
			buf.Reset()
			err = hardenTemplate(context.Background(), &buf, f, 9000)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				if f.conf[9000]["args"] == "" {
					t.Fatal("a refused harden changed the template")
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, buf.String())
			}
			for _, w := range tc.wantText {
				if !strings.Contains(buf.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, buf.String())
				}
			}
			if _, err := templateReport(context.Background(), f, 100); err == nil || !strings.Contains(err.Error(), "not a template") {
				t.Errorf("a plain VM checked as template: %v", err)
			}
		})
	}
}

// TestTemplateCheckUEFI: `template check` of a UEFI template (bios ovmf,
// a 4m EFI vars disk: an OVA's UEFI guest built without boot) passes it
// for the creates that may clone it, saying they ask firmware uefi.
func TestTemplateCheckUEFI(t *testing.T) {
	f := &fakeConfigs{conf: map[int]map[string]string{9000: {"template": "1", "bios": "ovmf", "efidisk0": "local-lvm:base-9000-disk-1,efitype=4m,pre-enrolled-keys=0,size=4M",
		"scsi0": "local-lvm:base-9000-disk-0,size=8G", "scsihw": "virtio-scsi-single"}}}
	rep, err := templateReport(context.Background(), f, 9000)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	writeReport(&buf, 9000, rep)
	if len(rep.TemplateFailures()) != 0 || !strings.Contains(buf.String(), "hardened for UEFI (bios ovmf): creates asking firmware uefi may clone it") {
		t.Errorf("check of a UEFI template:\n%s", buf.String())
	}
}
