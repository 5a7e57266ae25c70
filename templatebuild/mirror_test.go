package templatebuild_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/templatebuild"
)

// TestCheckMirror: a mirror is an http(s) base URL with a host, without
// credentials, query or fragment, whose host is no address the URL guard
// refuses.
func TestCheckMirror(t *testing.T) {
	for _, tc := range []struct {
		raw, wantErr string
	}{
		{"http://mirror.lan/cloud/", ""},
		{"https://mirror.lan", ""},
		{"http://10.1.2.3:8080/images", ""},
		{"ftp://mirror.lan/cloud/", "want an http or https URL"},
		{"mirror.lan/cloud/", "want an http or https URL"},
		{"http:///cloud/", "want an http or https URL"},
		{"http://user:secret@mirror.lan/", "carries credentials"},
		{"http://mirror.lan/cloud/?token=x", "query or fragment"},
		{"http://mirror.lan/cloud/?", "query or fragment"},
		{"http://mirror.lan/cloud/#x", "query or fragment"},
		{"http://127.0.0.1/cloud/", "loopback"},
		{"http://169.254.169.254/latest/", "link-local"},
		{"http://[fd00:ec2::254]/", "metadata"},
		{"http://[64:ff9b::7f00:1]/", "loopback"},
	} {
		err := templatebuild.CheckMirror(tc.raw)
		if tc.wantErr == "" && err != nil {
			t.Errorf("%q: %v, want accepted", tc.raw, err)
		}
		if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%q: %v, want %q", tc.raw, err, tc.wantErr)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: the error shows the password: %v", tc.raw, err)
		}
	}
}

// TestMirrorRecipe: a mirrored recipe fetches its image and its checksum
// list under MIRROR/RECIPE/ by the distribution's file names, with the
// same algorithm, file, OVA disk and archive member (kali2025.4's archive
// under its own name, its member unpacked to the shipped file); an empty
// mirror leaves the recipe as shipped.
func TestMirrorRecipe(t *testing.T) {
	rs := templatebuild.Recipes()
	for _, tc := range []struct {
		recipe, mirror, url, sums string
	}{
		{"debian13", "http://mirror.lan/cloud/", "http://mirror.lan/cloud/debian13/debian-13-genericcloud-amd64.qcow2", "http://mirror.lan/cloud/debian13/SHA512SUMS"},
		{"debian13", "http://mirror.lan/cloud", "http://mirror.lan/cloud/debian13/debian-13-genericcloud-amd64.qcow2", "http://mirror.lan/cloud/debian13/SHA512SUMS"},
		{"ubuntu24.04", "https://mirror.lan", "https://mirror.lan/ubuntu24.04/noble-server-cloudimg-amd64.ova", "https://mirror.lan/ubuntu24.04/SHA256SUMS"},
		{"debian13", "", rs["debian13"].Image.URL, rs["debian13"].Image.ChecksumURL},
		{"kali2025.4", "http://mirror.lan/", "http://mirror.lan/kali2025.4/kali-linux-2025.4-cloud-genericcloud-amd64.tar.xz", "http://mirror.lan/kali2025.4/SHA256SUMS"},
	} {
		shipped := rs[tc.recipe]
		r, err := templatebuild.MirrorRecipe(shipped, tc.mirror)
		if err != nil {
			t.Fatalf("%s from %q: %v", tc.recipe, tc.mirror, err)
		}
		if r.Image.URL != tc.url || r.Image.ChecksumURL != tc.sums {
			t.Errorf("%s from %q: %s and %s, want %s and %s", tc.recipe, tc.mirror, r.Image.URL, r.Image.ChecksumURL, tc.url, tc.sums)
		}
		if r.Image.File != shipped.Image.File || r.Image.Disk != shipped.Image.Disk || r.Image.Unpack != shipped.Image.Unpack || r.Image.Listed() != shipped.Image.Listed() ||
			r.Image.ChecksumAlg != shipped.Image.ChecksumAlg || r.Image.Checksum != "" {
			t.Errorf("%s from %q: image %+v, want the shipped file, disk and algorithm", tc.recipe, tc.mirror, r.Image)
		}
		if _, err := templatebuild.ImageFromURL(r.Image.URL, "", r.Image.Disk); err != nil && r.Image.Unpack == "" {
			t.Errorf("%s from %q: %v", tc.recipe, tc.mirror, err)
		}
	}
	if _, err := templatebuild.MirrorRecipe(rs["debian13"], "http://u:p@mirror.lan/"); err == nil {
		t.Error("a mirror with credentials was taken")
	}
}

// TestServiceMirrorGuarded: over the API a mirror's URLs pass the URL
// guard before anything logs in; a mirror naming what only the node
// reaches is the node's configuration error (not the request's), and a
// good one gets as far as the builder's login.
func TestServiceMirrorGuarded(t *testing.T) {
	errLogin := errors.New("login reached")
	for _, tc := range []struct {
		mirror string
		want   error
		says   string
	}{
		{"http://metadata.example/cloud/", sandbox.ErrNotConfigured, "169.254.169.254"},
		{"http://node.example/cloud/", sandbox.ErrNotConfigured, "node's own"},
		{"http://nowhere.example/cloud/", sandbox.ErrNotConfigured, "no such host"},
		{"http://images.example/cloud/", errLogin, "login reached"},
	} {
		svc, err := templatebuild.NewService(templatebuild.ServiceOptions{
			Login: func(context.Context) (templatebuild.Proxmox, error) { return nil, errLogin },
			Agent: &gatedAgent{}, Host: templatebuild.NodeHost{StateDir: t.TempDir()}, URLs: testGuard, Mirror: tc.mirror,
			Defaults: templatebuild.Options{Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local", Bridge: "bzv0"},
			LockDir:  t.TempDir(),
		})
		if err != nil {
			t.Fatal(err)
		}
		_, err = svc.Start(context.Background(), apitype.TemplateBuildRequest{Name: "debian13", Recipe: "debian13"})
		var inv *sandbox.InvalidError
		if !errors.Is(err, tc.want) || errors.As(err, &inv) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("mirror %s: %v, want %v saying %q", tc.mirror, err, tc.want, tc.says)
		}
	}
}
