package deb

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestAccessSetupKeepsOtherNodesTransfer: users, ACLs, pools and
// storage ids are cluster-wide (pmxcfs user.cfg, storage.cfg), and the
// token's privileges are the intersection of its own and its user's
// (pve-access-control RPCEnvironment.pm compile_acl_path). Node 2 runs
// with [api] disk_transfer_storage = "local": its token and the user hold
// PVEInspectTransfer on /storage/local, and "local" is in the shared pool.
// pve-access-setup on node 1 (no transfer storage) takes the user's grant
// on /storage/local and the pool's "local" back, as it did for the default
// of earlier versions, and node 2's daemon loses Datastore.Allocate and
// Datastore.AllocateSpace there (every transfer then fails with 403). The
// bridge grants are careful about this ("the user's stay, as other nodes'
// tokens need them"); the transfer takeback is not.
func TestAccessSetupKeepsOtherNodesTransfer(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "calls")
	other := `{"path":"/storage/local","propagate":0,"roleid":"PVEInspectTransfer","type":"token","ugid":"pve-inspectd@pve!daemon-node2"}`
	fake := `#!/bin/sh
echo "$*" >> ` + log + `
case "$*" in
"acl list --output-format json") echo '[` + other + `]' ;;
"pool list --poolid"*) echo '[{"members":[{"storage":"local","type":"storage"}],"poolid":"pve-inspect"}]' ;;
*"list --output-format json"*) echo '[]' ;;
"user token add"*) echo "{\"full-tokenid\":\"$4!$5\",\"value\":\"s3cret\"}" ;;
esac
`
	if err := os.WriteFile(filepath.Join(dir, "pveum"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFakePVE(t, dir)
	cmd := exec.Command("sh", "pve-access-setup")
	cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "PVE_INSPECTD_SECRET_FILE="+filepath.Join(dir, "pve-token"),
		"PVE_INSPECTD_CONFIG="+filepath.Join(dir, "no-config.toml"), "PVE_INSPECTD_TEMPLATES=9000")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pve-access-setup: %v\n%s", err, out)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{
		"acl delete /storage/local --users pve-inspectd@pve --roles PVEInspectTransfer",
		"pool modify pve-inspect --storage local --delete 1",
	} {
		if strings.Contains(string(b), bad) {
			t.Errorf("node 1's run takes back what node 2's token needs: %q", bad)
		}
	}
}
