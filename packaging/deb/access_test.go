package deb

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestAccessSetup runs pve-access-setup against a recording pveum and
// checks the grants: the pool with the templates' storage as a member, SDN
// (where PUT /cluster/sdn is checked),
// the node, the cluster firewall switch on "/" without propagation, and
// each template; a second run keeps the token secret.
func TestAccessSetup(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "calls")
	fake := `#!/bin/sh
echo "$*" >> ` + log + `
case "$*" in
*"list --output-format json"*) echo '[]' ;;
"user token add"*) echo '{"full-tokenid":"pve-inspectd@pve!daemon","value":"s3cret"}' ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "pveum"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "pve-token")
	run := func() {
		cmd := exec.Command("sh", "pve-access-setup")
		cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "PVE_INSPECTD_SECRET_FILE="+secret, "PVE_INSPECTD_TEMPLATES=9000 9001")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("pve-access-setup: %v\n%s", err, out)
		}
	}
	run()
	b, _ := os.ReadFile(log)
	calls := string(b)
	host, _ := os.Hostname()
	for _, want := range []string{
		"acl modify /pool/pve-inspect --tokens pve-inspectd@pve!daemon --roles PVEInspect --propagate 1",
		"acl modify /sdn --tokens pve-inspectd@pve!daemon --roles PVEInspect --propagate 1",
		"acl modify /nodes/" + host + " --tokens pve-inspectd@pve!daemon --roles PVEInspect --propagate 1",
		"acl modify / --tokens pve-inspectd@pve!daemon --roles PVEInspectCluster --propagate 0",
		"acl modify /vms/9000 --tokens pve-inspectd@pve!daemon --roles PVEInspectTemplate --propagate 0",
		"acl modify /vms/9001 --tokens pve-inspectd@pve!daemon --roles PVEInspectTemplate --propagate 0",
		"user token add pve-inspectd@pve daemon --privsep 1",
		// clone and resize check Datastore.AllocateSpace on the storage
		"pool modify pve-inspect --storage local-lvm",
	} {
		if !strings.Contains(calls, want) {
			t.Errorf("no call %q in:\n%s", want, calls)
		}
	}
	if strings.Contains(calls, "acl modify / --tokens pve-inspectd@pve!daemon --roles PVEInspect ") {
		t.Error("the main role was granted on /")
	}
	if s, _ := os.ReadFile(secret); !strings.Contains(string(s), "s3cret") {
		t.Fatalf("secret file: %q", s)
	}
	_ = os.Remove(log)
	run()
	b, _ = os.ReadFile(log)
	if strings.Contains(string(b), "token add") || strings.Contains(string(b), "token remove") {
		t.Errorf("second run touched the token:\n%s", b)
	}
}
