package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestTemplateBuildArgs: bad input is refused before the configuration is
// read or anything is called; good input gets as far as the configuration
// (here a missing file, so nothing after it runs).
func TestTemplateBuildArgs(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "absent.toml")
	sha := "sha256:" + strings.Repeat("ab", 32)
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"t1"}, "want --recipe or --from"},
		{[]string{"t1", "--recipe", "fedora"}, `--recipe "fedora": unknown; shipped: debian13, kali2025.4, ubuntu24.04`},
		{[]string{"t_1", "--recipe", "debian13"}, "want a DNS name"},
		{[]string{"t1", "--recipe", "kali2025.4"}, "tar -xJf"},
		{[]string{"t1", "--recipe", "debian13", "--checksum", sha}, "go with --from URL"},
		{[]string{"t1", "--from", "https://h/x.qcow2", "--checksum", "sha256:zz"}, "wants 64 hex digits"},
		{[]string{"t1", "--from", "https://h/x.tar.xz"}, "not one Proxmox imports"},
		{[]string{"t1", "--from", "https://h/x.ova"}, "--ova-disk"},
		{[]string{"t1", "--from", "local:import/x.qcow2", "--checksum", sha}, "go with --from URL"},
		{[]string{"t1", "--from", "local:images/x.qcow2"}, "STORAGE:import/FILE"},
		{[]string{"t1", "--from", "local:import/x.ova"}, "names the disk"},
		{[]string{"t1", "--recipe", "debian13", "--storage", "a b"}, `--storage "a b"`},
		{[]string{"t1", "--recipe", "debian13", "--build-cidr", "10.0.0.1/24"}, "--build-cidr"},
		{[]string{"t1", "--recipe", "ubuntu24.04", "--work-storage", "a/b"}, `--work-storage "a/b"`},
		{[]string{"t1", "t2", "--recipe", "debian13"}, "accepts 1 arg"},
		// Valid: they reach the configuration.
		{[]string{"t1", "--recipe", "debian13"}, "absent.toml"},
		{[]string{"t1", "--recipe", "kali2025.4", "--from", "local:import/k.raw"}, "absent.toml"},
		{[]string{"t1", "--from", "https://h/x.ova", "--ova-disk", "d.vmdk", "--checksum", sha}, "absent.toml"},
		{[]string{"t1", "--from", "local:import/u.ova/d.vmdk"}, "absent.toml"},
	} {
		root := newRootCmd()
		root.SetArgs(append([]string{"-c", cfg, "template", "build"}, tc.args...))
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&bytes.Buffer{})
		err := root.ExecuteContext(context.Background())
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.wantErr)
		}
		if out.Len() > 0 && !strings.Contains(out.String(), "Usage") {
			t.Errorf("%q printed %q", tc.args, out.String())
		}
	}
}
