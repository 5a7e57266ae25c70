package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/provision"
)

// TestNestedBadInput: each mistake is a clear error before libvirt is
// asked to change anything (the libvirt side runs in cloud/kvm's tests
// against a libvirtd of their own).
func TestNestedBadInput(t *testing.T) {
	root := fixtureRoot(t)
	nosock := "qemu:///system?socket=" + filepath.Join(t.TempDir(), "no-such-sock")
	cfg := []string{"--node-config", filepath.Join(root, "etc/pve-bootstrap/config.toml"),
		"--binary-url", "https://files.example.test/pve-bootstrap", "--binary-sha256", strings.Repeat("ef", 32)}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad name", append([]string{"nested", "create", "Bad_Name", "--connect", nosock}, cfg...), "node name"},
		{"unreachable create", append([]string{"nested", "create", "lab1", "--connect", nosock}, cfg...), "is libvirtd running"},
		{"unreachable list", []string{"nested", "list", "--connect", nosock}, "is libvirtd running"},
		{"bad uri", []string{"nested", "list", "--connect", "vbox:///session"}, "qemu driver"},
		{"bad subnet", []string{"nested", "list", "--subnet", "10.0.0.0/33"}, "--subnet"},
		{"stop without name", []string{"nested", "stop"}, "accepts 1 arg"},
	} {
		out, err := runCmd(t, fixtureDeps(&provision.RecordingRunner{}), tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q\n%s", tc.name, err, tc.want, out)
		}
	}
}
