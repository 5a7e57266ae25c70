package kvm

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckNested(t *testing.T) {
	mk := func(files map[string]string) string {
		root := t.TempDir()
		for p, c := range files {
			full := filepath.Join(root, p)
			os.MkdirAll(filepath.Dir(full), 0o755)
			os.WriteFile(full, []byte(c), 0o644)
		}
		return root
	}
	for _, tc := range []struct {
		name  string
		files map[string]string
		ok    bool
		want  string
	}{
		{"intel on", map[string]string{"sys/module/kvm_intel/parameters/nested": "Y\n", "dev/kvm": ""}, true, ""},
		{"amd on", map[string]string{"sys/module/kvm_amd/parameters/nested": "1\n", "dev/kvm": ""}, true, ""},
		{"intel off", map[string]string{"sys/module/kvm_intel/parameters/nested": "N\n", "dev/kvm": ""}, false, "options kvm_intel nested=1"},
		{"no module", map[string]string{}, false, "neither kvm_intel nor kvm_amd"},
		{"no device", map[string]string{"sys/module/kvm_intel/parameters/nested": "Y\n"}, false, "/dev/kvm"},
	} {
		err := CheckNested(mk(tc.files))
		var ne *NestedError
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case !tc.ok && (!errors.As(err, &ne) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func imageServer(t *testing.T, image []byte, sumFor []byte) *httptest.Server {
	sum := sha512.Sum512(sumFor)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/SHA512SUMS":
			fmt.Fprintf(w, "%s  debian-13-genericcloud-amd64.json\n%s  debian-13-genericcloud-amd64.qcow2\n", strings.Repeat("0", 128), hex.EncodeToString(sum[:]))
		case "/debian-13-genericcloud-amd64.qcow2":
			w.Write(image)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestImageFetchVerifies(t *testing.T) {
	img := []byte("QFI\xfb fake image")
	ctx := context.Background()
	srv := imageServer(t, img, img)
	im := Image{URL: srv.URL + "/debian-13-genericcloud-amd64.qcow2", SumsURL: srv.URL + "/SHA512SUMS"}
	cache := t.TempDir()
	p, err := im.Fetch(ctx, srv.Client(), cache)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); !bytes.Equal(b, img) {
		t.Error("cached image differs")
	}
	// A tampered image is refused and nothing lands in the cache.
	bad := imageServer(t, []byte("evil"), img)
	im = Image{URL: bad.URL + "/debian-13-genericcloud-amd64.qcow2", SumsURL: bad.URL + "/SHA512SUMS"}
	cache2 := t.TempDir()
	_, err = im.Fetch(ctx, bad.Client(), cache2)
	var ce *ChecksumError
	if !errors.As(err, &ce) {
		t.Errorf("tampered image: %v", err)
	}
	if ents, _ := os.ReadDir(cache2); len(ents) != 0 {
		t.Errorf("cache holds %v after a bad download", ents)
	}
	if _, err := ExpectedSHA512([]byte("abc  other.qcow2\n"), "debian.qcow2"); err == nil {
		t.Error("missing entry accepted")
	}
}
