package templatebuild

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

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

// TestBuildStripsGuestControlCharacters: the build guest is hostile once
// booted and its agent's output (cloud-init status, the checks) goes
// into the build's errors and progress lines, which the CLI prints on
// the operator's terminal: no escape sequence (OSC 52 clipboard writes,
// title changes, cursor moves hiding lines) may reach it; the text does.
func TestBuildStripsGuestControlCharacters(t *testing.T) {
	w := newWorld()
	evil := "status: error\x1b]52;c;cm0gLXJmIH4K\x07\x1b[2K\x1b[1A\u009b2J"
	w.agent.replies["cloud-init"] = AgentResult{Exit: 1, Output: evil}
	_, out, err := runReview(t, w)
	if err == nil {
		t.Fatal("cloud-init error: the build passed")
	}
	if strings.ContainsAny(err.Error(), "\x1b\a\u009b") || strings.ContainsAny(out, "\x1b\a\u009b") {
		t.Errorf("the guest's control characters reach the operator's terminal: %q / %q", err.Error(), out)
	}
	if !strings.Contains(err.Error(), "status: error]52;c;cm0gLXJmIH4K") {
		t.Errorf("the guest's text is lost: %q", err.Error())
	}
}

// TestFetchRefusesHTTPSDowngrade: the checksum list is fetched over
// HTTPS; a redirect from the https URL to plain http, where anyone on the
// path may rewrite the list to match a substituted image, is refused.
func TestFetchRefusesHTTPSDowngrade(t *testing.T) {
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
