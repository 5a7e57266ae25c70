package templatebuild_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
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

// TestGuardedClientRebinding: the URL guard resolves a host when it
// checks the URL, and the connection resolves it again: a host whose
// answer changes in between (here the guard's resolver answers a public
// address for it, the system's loopback, as a rebinding name answers
// once each) must not bring the daemon's own fetch (GuardedClient, the
// daemon's NodeHost's) to loopback, the metadata services or the node's
// own addresses: each connection's address is checked too. A host that
// stays public is fetched.
func TestGuardedClientRebinding(t *testing.T) {
	var mu sync.Mutex
	fetched := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		fetched++
		mu.Unlock()
		_, _ = w.Write([]byte("what only the node reaches\n"))
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	guard := testGuard
	guard.Resolve = func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("203.0.113.10")}, nil
	}
	u := "http://localhost:" + port + "/kali2025.4/SHA256SUMS"
	if err := guard.Check(context.Background(), u); err != nil {
		t.Fatalf("the guard refuses the host it resolves to a public address: %v", err)
	}
	host := templatebuild.NodeHost{HTTPClient: templatebuild.GuardedClient(guard), StateDir: t.TempDir(), Redirect: guard.Check}
	if body, err := host.Fetch(context.Background(), u, 1<<20); !errors.Is(err, templatebuild.ErrURLRefused) {
		t.Errorf("a fetch whose host now resolves to loopback: %q %v, want refused", body, err)
	}
	if rc, _, err := host.Open(context.Background(), u); !errors.Is(err, templatebuild.ErrURLRefused) {
		if rc != nil {
			_ = rc.Close()
		}
		t.Errorf("an archive whose host now resolves to loopback: %v, want refused", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fetched != 0 {
		t.Errorf("the loopback server answered %d fetches", fetched)
	}
	// the check itself, for the addresses a connection goes to
	for addr, refused := range map[string]bool{"127.0.0.1:80": true, "[::1]:443": true, "169.254.169.254:80": true, "[64:ff9b::a9fe:a9fe]:80": true,
		"192.0.2.5:8006": true, "203.0.113.10:443": false, "[2001:db8::1]:80": false} {
		if err := guard.Control("tcp", addr, nil); errors.Is(err, templatebuild.ErrURLRefused) != refused {
			t.Errorf("connect to %s: %v, want refused %v", addr, err, refused)
		}
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
