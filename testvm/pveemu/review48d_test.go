package pveemu

import (
	"net/url"
	"strings"
	"testing"
)

// TestReview48dACLGrantNeedsSupersetWithoutPermissionsModify: update_acl
// (pve-access-control src/PVE/API2/ACL.pm) lets a caller without
// Permissions.Modify on the path (perm-modify passes on /vms/ID with
// VM.Allocate) hand out only roles whose every privilege it holds there:
// "Cannot add role 'R' - requires 'Permissions.Modify' or superset of
// privileges." (and NoAccess never). The template build's grant runs as
// [templates] builder_user, which need not be root@pam.
func TestReview48dACLGrantNeedsSupersetWithoutPermissionsModify(t *testing.T) {
	e := newEnv(t)
	e.ok("POST", "/access/users", url.Values{"userid": {"builder@pve"}, "password": {"pw-pw-pw-pw"}})
	tok, _ := e.ok("POST", "/access/users/builder@pve/token/builder", url.Values{"privsep": {"0"}}).(map[string]any)
	auth := "PVEAPIToken=" + tok["full-tokenid"].(string) + "=" + tok["value"].(string)
	e.ok("PUT", "/access/acl", url.Values{"path": {"/vms/100"}, "users": {"builder@pve"}, "roles": {"PVEVMAdmin"}, "propagate": {"0"}})
	for _, role := range []string{"Administrator", "NoAccess"} {
		r := e.do("PUT", "/access/acl", url.Values{"path": {"/vms/100"}, "users": {"builder@pve"}, "roles": {role}, "propagate": {"0"}}, authNone, "Authorization", auth)
		if r.status == 200 || !strings.Contains(r.errors()["role"], "requires 'Permissions.Modify'") {
			t.Errorf("grant %s on /vms/100 with VM.Allocate there only: %d %q %v, want refused (requires 'Permissions.Modify')", role, r.status, r.reason, r.errors())
		}
	}
}
