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
