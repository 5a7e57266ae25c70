package templatebuild

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
)

// TestBuildFromURLTakesNoFileOnTheStorage: a build --from URL without
// --checksum never takes a file already on the image storage. A user
// allowed to upload import files (Datastore.AllocateTemplate on the
// storage, pve-storage Status.pm upload) may put one under the URL's
// name, or under the build's own: the first is ignored (the build
// downloads to its own name), the second refused, as Proxmox's download
// refuses to override an existing file without a checksum.
func TestBuildFromURLTakesNoFileOnTheStorage(t *testing.T) {
	const url = "https://images.example/img.qcow2"
	img, err := ImageFromURL(url, "", "")
	if err != nil {
		t.Fatal(err)
	}
	own := "local:import/" + BuildFile(url, "img.qcow2", "")
	for _, tc := range []struct {
		name, planted string
		wantCreate    bool
	}{
		{"a file of the URL's name", "local:import/img.qcow2", true},
		{"a file of the build's name", own, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld()
			w.pve.vols[tc.planted] = "planted"
			var out bytes.Buffer
			b, err := New(w.pve, w.agent, w.host, Options{Name: "t1", Recipe: Generic(img), Storage: "local-lvm", ImageStorage: "local",
				SnippetStorage: "local", Bridge: "vmbr0", AgentPoll: 1, Progress: &out})
			if err != nil {
				t.Fatal(err)
			}
			_, err = b.Run(context.Background())
			if len(w.pve.created) != map[bool]int{true: 1}[tc.wantCreate] {
				t.Fatalf("creates %v (err %v), want a create %v:\n%s", w.pve.created, err, tc.wantCreate, out.String())
			}
			if !tc.wantCreate {
				if err == nil || !strings.Contains(err.Error(), "no checksum to verify it") {
					t.Errorf("err %v", err)
				}
				return
			}
			if got := w.pve.created[0]["scsi0"]; got != "local-lvm:0,import-from="+own {
				t.Errorf("the create imports %q, want the build's own download %s", got, own)
			}
			if !slices.Contains(w.pve.calls, "download "+url+" :") {
				t.Errorf("calls %v: want the download", w.pve.calls)
			}
		})
	}
}

// TestImageFromURLFileName: the file name is the URL's as download-url
// stores it (pve-storage Storage.pm normalize_content_filename: every
// character outside [a-zA-Z0-9_.-] becomes '_'); ftp is refused (the
// download-url API's url pattern is https?://.*).
func TestImageFromURLFileName(t *testing.T) {
	img, err := ImageFromURL("https://images.example/img+v2=x.qcow2", "", "")
	if err != nil || img.File != "img_v2_x.qcow2" {
		t.Errorf("--from img+v2=x.qcow2: %+v %v, want the file img_v2_x.qcow2", img, err)
	}
	if _, err := ImageFromURL("ftp://images.example/img.qcow2", "", ""); err == nil {
		t.Error("--from ftp://: accepted")
	}
}
