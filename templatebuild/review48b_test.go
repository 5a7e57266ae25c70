package templatebuild

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Review 48b: failing tests of findings in `template build` (each one
// fails on 938c9da and passes once its finding is fixed).

// runReview runs a debian13 build of t1 in w.
func runReview(t *testing.T, w world) (Result, string, error) {
	t.Helper()
	var out bytes.Buffer
	b, err := New(w.pve, w.agent, w.host, Options{Name: "t1", Recipe: Recipes()["debian13"], Storage: "local-lvm", ImageStorage: "local",
		SnippetStorage: "local", Bridge: "vmbr0", AgentPoll: 1, Progress: &out})
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Run(context.Background())
	return res, out.String(), err
}

// TestReviewReuseAdoptsForeignTemplate: the find step reuses any template
// named NAME that carries the three tags, whoever made it and whatever
// its config. The daemon's sandbox token (VM.Allocate, VM.Config.Options
// on its pool: enough to create a VM, tag it and convert it) can plant
// one; the CLI then prints "grant the daemon's token on it:
// PVE_INSPECTD_TEMPLATES=... <that VMID>" and the operator takes the
// planted disk as the sandbox template. The reused template is not even
// checked against the hardened profile (Result.Report is empty).
func TestReviewReuseAdoptsForeignTemplate(t *testing.T) {
	for _, tc := range []struct {
		name string
		conf map[string]string
	}{
		{"a template in the daemon's pool", map[string]string{"name": "t1", "template": "1", "tags": "builtin-debian13;inspect;pvei-template", "pool": "pve-inspect"}},
		// not hardened: no q35, a display, no agent, ...
		{"a template outside the hardened profile", map[string]string{"name": "t1", "template": "1", "tags": "builtin-debian13;inspect;pvei-template", "vga": "std", "args": "-no-reboot"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld()
			w.pve.vms[130] = tc.conf
			res, out, err := runReview(t, w)
			if err == nil && res.Reused {
				t.Errorf("VM 130 (%v) adopted as the build's template: %+v\n%s", tc.conf, res, out)
			}
		})
	}
}

// TestReviewFindDestroysForeignVM: any VM named NAME and tagged
// pvei-building is destroyed by the operator's (root's) build. Name and
// tags are VM.Config.Options; a VM in a pool was never made by a build
// (the build's create names no pool), so a user who may change a VM's
// options but not destroy it gets root to destroy it.
func TestReviewFindDestroysForeignVM(t *testing.T) {
	w := newWorld()
	w.pve.vms[130] = map[string]string{"name": "t1", "tags": TagBuilding, "status": "running", "pool": "pve-inspect"}
	_, out, _ := runReview(t, w)
	for _, c := range w.pve.calls {
		if c == "delete 130" {
			t.Errorf("the build destroyed VM 130, a pool VM it never created:\n%s", out)
		}
	}
}

// TestReviewGuestOutputReachesTerminal: the build guest is hostile once
// booted and its agent's output (cloud-init status, the checks) is put
// verbatim into the build's errors and progress lines, which the CLI
// prints on the operator's terminal: escape sequences (OSC 52 clipboard
// writes, title changes, cursor moves hiding lines) reach it.
func TestReviewGuestOutputReachesTerminal(t *testing.T) {
	w := newWorld()
	evil := "status: error\x1b]52;c;cm0gLXJmIH4K\x07\x1b[2K\x1b[1A"
	w.agent.replies["cloud-init"] = AgentResult{Exit: 1, Output: evil}
	_, out, err := runReview(t, w)
	if err == nil {
		t.Fatal("cloud-init error: the build passed")
	}
	if strings.ContainsRune(err.Error(), 0x1b) || strings.ContainsRune(out, 0x1b) {
		t.Errorf("the guest's control characters reach the operator's terminal: %q / %q", err.Error(), out)
	}
}

// TestReviewChecksumListRedirectDowngrade: the checksum list is fetched
// "over HTTPS" (README), but NodeHost.Fetch follows a redirect from the
// https URL to plain http (Go's default redirect policy), where anyone
// on the path may rewrite the list to match a substituted image.
func TestReviewChecksumListRedirectDowngrade(t *testing.T) {
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(strings.Repeat("0", 64) + "  img.qcow2\n"))
	}))
	defer plain.Close()
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plain.URL+"/SHA256SUMS", http.StatusFound)
	}))
	defer tlsSrv.Close()
	body, err := NodeHost{HTTPClient: tlsSrv.Client()}.Fetch(context.Background(), tlsSrv.URL+"/SHA256SUMS", 1<<20)
	if err == nil {
		t.Errorf("the https checksum list was read over plain http after a redirect: %q", body)
	}
}
