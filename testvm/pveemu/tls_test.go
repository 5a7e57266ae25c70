package pveemu

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestServeTLS serves over a real TLS listener with the self-signed
// certificate and checks that Proxmox's reason phrases reach the client.
func TestServeTLS(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Backend: NewFakeBackend(filepath.Join(dir, "run")), DataDir: filepath.Join(dir, "data")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	roots := make(chan *x509.CertPool, 1)
	done := make(chan error, 1)
	go func() { done <- s.ServeTLS(ctx, l, roots) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeTLS: %v", err)
		}
	}()
	var pool *x509.CertPool
	select {
	case pool = <-roots:
	case <-time.After(time.Minute):
		t.Fatal("no certificate")
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: time.Minute}
	ticket, csrf := s.RootTicket()
	req, _ := http.NewRequest("GET", "https://"+l.Addr().String()+"/api2/json/nodes/pve/qemu/123/config", nil)
	req.Header.Set("Cookie", "PVEAuthCookie="+ticket)
	req.Header.Set("CSRFPreventionToken", csrf)
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.Status != "500 Configuration file 'nodes/pve/qemu-server/123.conf' does not exist" {
		t.Fatalf("status line %q", res.Status)
	}
}
