package templatebuild_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/templatebuild"
)

// TestMirrorListRedirectGuarded: over the API a mirror's checksum list is
// fetched by the daemon itself (NodeHost.Fetch, as root on the node) after
// the URL guard passed the mirror's host; a redirect from the mirror (a
// compromised one, or anyone on the path of an http mirror) must not send
// that fetch to what the guard refuses (the metadata service, loopback,
// the node's own addresses): each redirect's target passes the guard too.
func TestMirrorListRedirectGuarded(t *testing.T) {
	var mu sync.Mutex
	var hosts []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hosts = append(hosts, r.Host)
		mu.Unlock()
		if r.URL.Path == "/mirror/debian13/SHA512SUMS" || strings.HasSuffix(r.URL.Path, ".tar.xz") {
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/iam/security-credentials/", http.StatusFound)
			return
		}
		_, _ = w.Write([]byte("secret-role-credentials\n"))
	}))
	defer srv.Close()
	// the node reaches every host at srv (as the bed's uplink serves any
	// name): the metadata address included
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
	}}}
	u := "http://images.example/mirror/debian13/SHA512SUMS"
	if err := testGuard.Check(context.Background(), u); err != nil {
		t.Fatalf("the guard refuses the mirror: %v", err)
	}
	// the daemon's host ([templates] build): its fetches' redirects pass
	// the build's URL guard, the archive's (Open) as the list's (Fetch)
	host := templatebuild.NodeHost{HTTPClient: hc, StateDir: t.TempDir(), Redirect: testGuard.Check}
	body, err := host.Fetch(context.Background(), u, 1<<20)
	if !errors.Is(err, templatebuild.ErrURLRefused) {
		t.Errorf("a redirect of the mirror's list to the metadata address: %q %v, want refused by the guard", body, err)
	}
	archive := "http://images.example/mirror/kali2025.4/kali-linux-2025.4-cloud-genericcloud-amd64.tar.xz"
	if rc, _, err := host.Open(context.Background(), archive); !errors.Is(err, templatebuild.ErrURLRefused) {
		if rc != nil {
			_ = rc.Close()
		}
		t.Errorf("a redirect of the mirror's archive to the metadata address: %v, want refused by the guard", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(hosts, "169.254.169.254") {
		t.Errorf("the daemon fetched from the metadata address: %v", hosts)
	}
}

// TestOpenStalls: an archive whose server stops sending fails the read
// once Stall passes with no byte (the request is cancelled, so the server
// sees it end), naming the URL; bytes that keep coming keep it going.
func TestOpenStalls(t *testing.T) {
	ended := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("the first bytes"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(ended)
	}))
	defer srv.Close()
	host := templatebuild.NodeHost{HTTPClient: srv.Client(), Stall: 50 * time.Millisecond}
	rc, _, err := host.Open(context.Background(), srv.URL+"/a.tar.xz")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if string(b) != "the first bytes" || err == nil || !strings.Contains(err.Error(), "GET "+srv.URL+"/a.tar.xz: no byte for 50ms") {
		t.Errorf("a stalled archive: %q %v", b, err)
	}
	<-ended
}
