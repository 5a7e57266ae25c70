package ec2

import (
	"bytes"
	"errors"
	"mime"
	"mime/multipart"
	"net/mail"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

var testUD = UserData{
	Config: []byte(`hostname = "pve1"
domain = "example.test"

[inspectd]
source = "https://files.example.test/pve-inspectd_1.0_amd64.deb"
sha256 = "1111111111111111111111111111111111111111111111111111111111111111"
`),
	BinaryURL:    "https://files.example.test/pve-bootstrap-linux-amd64",
	BinarySHA256: "2222222222222222222222222222222222222222222222222222222222222222",
}

// parts splits a rendered document with the standard library's MIME reader.
func parts(t *testing.T, doc []byte) map[string][]byte {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/mixed" {
		t.Fatalf("content type %q %v", mt, err)
	}
	out := map[string][]byte{}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for {
		p, err := mr.NextPart()
		if err != nil {
			break
		}
		ct, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type"))
		var b bytes.Buffer
		b.ReadFrom(p)
		out[ct] = b.Bytes()
	}
	return out
}

func TestRenderUserData(t *testing.T) {
	doc, err := Render(testUD)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "userdata.golden", doc)
	ps := parts(t, doc)
	cc, sh := ps["text/cloud-config"], ps["text/x-shellscript"]
	if !bytes.HasPrefix(cc, []byte("#cloud-config\n")) || !bytes.Equal(sh, ShellPart()) {
		t.Fatalf("parts: %q", ps)
	}
	if !bytes.Contains(cc, []byte("sha256sum --check")) || !bytes.Contains(cc, []byte(testUD.BinarySHA256)) {
		t.Error("cloud-config does not verify the binary")
	}

	enc, err := Encode(doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(enc) > MaxUserData {
		t.Errorf("encoded %d bytes", len(enc))
	}
	back, err := Decode(enc)
	if err != nil || !bytes.Equal(back, doc) {
		t.Errorf("decode: %v", err)
	}

	// The cloud-config part passes Debian's cloud-init schema validation.
	if _, err := exec.LookPath("cloud-init"); err != nil {
		if testkit.InCI() {
			t.Fatal("cloud-init not installed (CI)")
		}
		t.Skip("SKIPPING schema check: cloud-init not installed")
	}
	f := filepath.Join(t.TempDir(), "cloud-config.yaml")
	if err := os.WriteFile(f, cc, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("cloud-init", "schema", "--config-file", f).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Valid cloud-config") {
		t.Errorf("cloud-init schema: %v\n%s", err, out)
	}
	// And a broken document fails it: the check can fail.
	if err := os.WriteFile(f, []byte("#cloud-config\nruncmd: 42\nwrite_files: nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cloud-init", "schema", "--config-file", f).CombinedOutput(); err == nil {
		t.Errorf("cloud-init schema accepted a broken document:\n%s", out)
	}
}

func TestEncodeTooLarge(t *testing.T) {
	// Random-ish content that gzip cannot shrink below the limit.
	big := make([]byte, 20000)
	x := uint32(1)
	for i := range big {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		big[i] = byte(x)
	}
	if _, err := Encode(big); !errors.Is(err, ErrTooLarge) {
		t.Errorf("err = %v, want ErrTooLarge", err)
	}
}

func TestUserDataRejectsBadInput(t *testing.T) {
	for _, u := range []UserData{
		{Config: testUD.Config, BinaryURL: "ftp://x/y", BinarySHA256: testUD.BinarySHA256},
		{Config: testUD.Config, BinaryURL: testUD.BinaryURL, BinarySHA256: "abc"},
		{Config: testUD.Config, BinaryURL: testUD.BinaryURL, BinarySHA256: strings.Repeat("'", 64)},
		{BinaryURL: testUD.BinaryURL, BinarySHA256: testUD.BinarySHA256},
	} {
		if _, err := Render(u); err == nil {
			t.Errorf("accepted %+v", u)
		}
	}
}
