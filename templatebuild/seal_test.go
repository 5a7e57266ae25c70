package templatebuild

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSealCommand runs the seal's shell command on a directory tree
// standing for the guest's root (its paths moved below it, systemctl and
// cloud-init stubs that log their arguments): the machine id is emptied,
// the leases, random seed and SSH host keys are gone, cloud-init is
// cleaned with its logs, and the first-boot host key unit is written and
// enabled.
func TestSealCommand(t *testing.T) {
	root, bin := t.TempDir(), t.TempDir()
	files := map[string]string{
		"etc/machine-id": "0123", "var/lib/dbus/machine-id": "0123", "var/lib/dhcp/dhclient.eth0.leases": "lease",
		"var/lib/systemd/random-seed": "seed", "etc/ssh/ssh_host_ed25519_key": "k", "etc/ssh/ssh_host_ed25519_key.pub": "p",
		"etc/ssh/sshd_config": "Port 22", "etc/systemd/system/.keep": "",
	}
	for p, c := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	log := filepath.Join(bin, "log")
	for _, name := range []string{"systemctl", "cloud-init"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\necho "+name+" \"$@\" >> "+log+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if sealCommand[0] != "sh" || sealCommand[1] != "-c" || len(sealCommand) != 4 {
		t.Fatalf("seal command %q", sealCommand)
	}
	script := strings.NewReplacer("/etc/", root+"/etc/", "/var/", root+"/var/").Replace(sealCommand[2])
	cmd := exec.Command("sh", "-c", script, sealCommand[3])
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("seal: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(filepath.Join(root, "etc/machine-id")); err != nil || len(b) != 0 {
		t.Errorf("machine-id %q %v", b, err)
	}
	for _, p := range []string{"var/lib/dbus/machine-id", "var/lib/dhcp/dhclient.eth0.leases", "var/lib/systemd/random-seed", "etc/ssh/ssh_host_ed25519_key", "etc/ssh/ssh_host_ed25519_key.pub"} {
		if _, err := os.Stat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s left (%v)", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "etc/ssh/sshd_config")); err != nil {
		t.Errorf("sshd_config removed: %v", err)
	}
	unit, err := os.ReadFile(filepath.Join(root, "etc/systemd/system/pvei-ssh-hostkeys.service"))
	if err != nil || string(unit) != sshKeysUnit {
		t.Errorf("unit %q %v", unit, err)
	}
	calls, _ := os.ReadFile(log)
	if string(calls) != "cloud-init clean --logs\nsystemctl enable pvei-ssh-hostkeys.service\n" {
		t.Errorf("calls:\n%s", calls)
	}
}
