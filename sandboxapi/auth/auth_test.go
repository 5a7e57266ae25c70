package auth

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCreateVerifyRevoke(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.json")
	s := Open(path)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tok, meta, err := s.Create("harness", []string{"exec"}, now)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if strings.Contains(string(b), tok[len("pvei_")+9:]) {
		t.Fatal("token file contains the secret")
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v", fi.Mode())
	}
	name, scopes, err := s.Verify(tok)
	if err != nil || name != "harness" || !slices.Equal(scopes, []string{"exec"}) {
		t.Fatalf("verify: %q %v %v", name, scopes, err)
	}
	flip := "A"
	if strings.HasSuffix(tok, "A") {
		flip = "B"
	}
	bad := []string{"", "pvei_", tok + "x", tok[:len(tok)-1] + flip, strings.Replace(tok, meta.ID, "00000000", 1), "Bearer " + tok}
	for _, b := range bad {
		if _, _, err := s.Verify(b); err == nil {
			t.Errorf("Verify(%q) accepted", b)
		}
	}
	if _, _, err := s.Create("harness", []string{"read"}, now); err == nil {
		t.Error("duplicate name accepted")
	}
	for _, sc := range [][]string{nil, {"root"}} {
		if _, _, err := s.Create("x", sc, now); err == nil {
			t.Errorf("scopes %v accepted", sc)
		}
	}
	if _, _, err := s.Create("bad name", []string{"read"}, now); err == nil {
		t.Error("bad name accepted")
	}
	// A second store (another process) sees revocation without restart.
	if err := Open(path).Revoke("harness"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if _, _, err := s.Verify(tok); err == nil {
		t.Error("revoked token accepted")
	}
	if err := s.Revoke("harness"); err == nil {
		t.Error("revoking twice succeeded")
	}
	l, err := s.List()
	if err != nil || len(l) != 0 {
		t.Errorf("list after revoke: %v %v", l, err)
	}
}

func FuzzVerify(f *testing.F) {
	path := filepath.Join(f.TempDir(), "tokens.json")
	s := Open(path)
	tok, _, err := s.Create("t", []string{"read"}, time.Now())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tok)
	f.Add("pvei_00000000_" + strings.Repeat("A", 43))
	f.Add("\x00")
	f.Fuzz(func(t *testing.T, in string) {
		_, _, err := s.Verify(in)
		if (err == nil) != (in == tok) {
			t.Fatalf("Verify(%q) = %v", in, err)
		}
	})
}
