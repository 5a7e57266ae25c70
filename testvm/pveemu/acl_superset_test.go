package pveemu

import (
	"net/url"
	"strings"
	"testing"
)

// aclRefusal is the message of update_acl's parameter exception raised
// inside lock_user_config: a 500 "ACL update failed: " with the exception
// stringified.
func aclRefusal(param, msg string) string {
	return "ACL update failed: 400 Parameter verification failed.\n" + param + ": " + msg + "\n"
}

// builderEnv is an emulator where builder@pve holds PVEVMAdmin (so
// VM.Allocate, not Permissions.Modify) on /vms/100 without propagation,
// agent@pve exists to be granted roles, and auth is builder@pve's
// non-separated token.
func builderEnv(t *testing.T) (e *env, auth string) {
	t.Helper()
	e = newEnv(t)
	e.ok("POST", "/access/users", url.Values{"userid": {"builder@pve"}, "password": {"pw-pw-pw-pw"}})
	e.ok("POST", "/access/users", url.Values{"userid": {"agent@pve"}, "password": {"pw-pw-pw-pw"}})
	tok, _ := e.ok("POST", "/access/users/builder@pve/token/builder", url.Values{"privsep": {"0"}}).(map[string]any)
	auth = "PVEAPIToken=" + tok["full-tokenid"].(string) + "=" + tok["value"].(string)
	e.ok("PUT", "/access/acl", url.Values{"path": {"/vms/100"}, "users": {"builder@pve"}, "roles": {"PVEVMAdmin"}, "propagate": {"0"}})
	return e, auth
}

// hasACL reports whether root's GET /access/acl lists role for ugid on path.
func hasACL(e *env, path, ugid, role string) bool {
	e.t.Helper()
	list, _ := e.ok("GET", "/access/acl", nil).([]any)
	for _, x := range list {
		m, _ := x.(map[string]any)
		if m["path"] == path && m["ugid"] == ugid && m["roleid"] == role {
			return true
		}
	}
	return false
}

// TestACLGrantNeedsSupersetWithoutPermissionsModify (from the review48d
// reviewer's test): update_acl (pve-access-control src/PVE/API2/ACL.pm)
// lets a caller without Permissions.Modify on the path (perm-modify passes
// on /vms/ID with VM.Allocate) hand out only roles whose every privilege it
// holds there, and NoAccess never. The template build's grant runs as
// [templates] builder_user, which need not be root@pam. The refusal is
// raised inside lock_user_config, so it is a 500 "ACL update failed: ...",
// not a 400 with a "role" error.
func TestACLGrantNeedsSupersetWithoutPermissionsModify(t *testing.T) {
	e, auth := builderEnv(t)
	want := map[string]string{
		"Administrator": "Cannot add role 'Administrator' - requires 'Permissions.Modify' or superset of privileges.",
		"NoAccess":      "Cannot add role 'NoAccess' - requires 'Permissions.Modify'",
	}
	for _, role := range []string{"Administrator", "NoAccess"} {
		r := e.do("PUT", "/access/acl", url.Values{"path": {"/vms/100"}, "users": {"builder@pve"}, "roles": {role}, "propagate": {"0"}}, authNone, "Authorization", auth)
		if r.status != 500 || r.body["message"] != aclRefusal("role", want[role]) {
			t.Errorf("grant %s on /vms/100 with VM.Allocate there only: %d %q, want 500 %q", role, r.status, r.body["message"], aclRefusal("role", want[role]))
		}
		if hasACL(e, "/vms/100", "builder@pve", role) {
			t.Errorf("refused grant of %s was written", role)
		}
	}
}

// TestACLUpdateWithoutPermissionsModify drives update_acl's other rules for
// a caller let in by VM.Allocate: a subset role without propagation is
// granted, with propagation it needs the privileges propagated, a delete
// needs the subset but not the propagation, a failure writes nothing of
// the request, and unknown roles and groups die inside the lock.
func TestACLUpdateWithoutPermissionsModify(t *testing.T) {
	cases := []struct {
		name     string
		form     url.Values
		status   int
		message  string
		wantRole string // role on /vms/100 for agent@pve afterwards
		present  bool
	}{
		{name: "subset role without propagation is granted",
			form:   url.Values{"users": {"agent@pve"}, "roles": {"PVEVMUser"}, "propagate": {"0"}},
			status: 200, wantRole: "PVEVMUser", present: true},
		{name: "subset role with propagation needs propagated privileges",
			form:   url.Values{"users": {"agent@pve"}, "roles": {"PVEVMUser"}},
			status: 500, message: aclRefusal("role", "Cannot add role 'PVEVMUser' with propagation - requires 'Permissions.Modify' or propagated superset of privileges."),
			wantRole: "PVEVMUser"},
		{name: "equal role is granted",
			form:   url.Values{"users": {"agent@pve"}, "roles": {"PVEVMAdmin"}, "propagate": {"0"}},
			status: 200, wantRole: "PVEVMAdmin", present: true},
		{name: "a refused role writes none of the request",
			form:   url.Values{"users": {"agent@pve"}, "roles": {"PVEVMUser,PVESysAdmin"}, "propagate": {"0"}},
			status: 500, message: aclRefusal("role", "Cannot add role 'PVESysAdmin' - requires 'Permissions.Modify' or superset of privileges."),
			wantRole: "PVEVMUser"},
		{name: "delete of a role beyond the caller's privileges is refused",
			form:   url.Values{"users": {"agent@pve"}, "roles": {"Administrator"}, "delete": {"1"}},
			status: 500, message: aclRefusal("role", "Cannot remove role 'Administrator' - requires 'Permissions.Modify' or superset of privileges."),
			wantRole: "Administrator"},
		{name: "unknown role",
			form:   url.Values{"users": {"agent@pve"}, "roles": {"NoSuchRole"}, "propagate": {"0"}},
			status: 500, message: "ACL update failed: role 'NoSuchRole' does not exist\n",
			wantRole: "NoSuchRole"},
		{name: "unknown group",
			form:   url.Values{"groups": {"admins"}, "roles": {"PVEVMUser"}, "propagate": {"0"}},
			status: 500, message: "ACL update failed: group 'admins' does not exist\n",
			wantRole: "PVEVMUser"},
		{name: "unknown user",
			form:   url.Values{"users": {"ghost@pve"}, "roles": {"PVEVMUser"}, "propagate": {"0"}},
			status: 500, message: "ACL update failed: user 'ghost@pve' does not exist\n",
			wantRole: "PVEVMUser"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, auth := builderEnv(t)
			c.form.Set("path", "/vms/100")
			r := e.do("PUT", "/access/acl", c.form, authNone, "Authorization", auth)
			if r.status != c.status || (c.message != "" && r.body["message"] != c.message) {
				t.Fatalf("PUT /access/acl %v: %d %q, want %d %q", c.form, r.status, r.body["message"], c.status, c.message)
			}
			if got := hasACL(e, "/vms/100", "agent@pve", c.wantRole); got != c.present {
				t.Errorf("agent@pve has %s on /vms/100: %v, want %v", c.wantRole, got, c.present)
			}
		})
	}

	t.Run("delete without propagated privileges", func(t *testing.T) {
		e, auth := builderEnv(t)
		e.ok("PUT", "/access/acl", url.Values{"path": {"/vms/100"}, "users": {"agent@pve"}, "roles": {"PVEVMUser"}})
		r := e.do("PUT", "/access/acl", url.Values{"path": {"/vms/100"}, "users": {"agent@pve"}, "roles": {"PVEVMUser"}, "delete": {"1"}}, authNone, "Authorization", auth)
		if r.status != 200 || hasACL(e, "/vms/100", "agent@pve", "PVEVMUser") {
			t.Fatalf("delete of a held role with propagate defaulted: %d %v, want 200 and the entry gone", r.status, r.body)
		}
	})
}

// TestACLUpdateWithPermissionsModify: root@pam, and a user holding
// Permissions.Modify on the path, grant any role there, NoAccess included
// and with propagation.
func TestACLUpdateWithPermissionsModify(t *testing.T) {
	e, _ := builderEnv(t)
	for _, role := range []string{"Administrator", "NoAccess"} {
		e.ok("PUT", "/access/acl", url.Values{"path": {"/vms/100"}, "users": {"agent@pve"}, "roles": {role}})
		if !hasACL(e, "/vms/100", "agent@pve", role) {
			t.Errorf("root@pam's grant of %s not written", role)
		}
	}

	e.ok("POST", "/access/users", url.Values{"userid": {"owner@pve"}, "password": {"pw-pw-pw-pw"}})
	tok, _ := e.ok("POST", "/access/users/owner@pve/token/owner", url.Values{"privsep": {"0"}}).(map[string]any)
	auth := "PVEAPIToken=" + tok["full-tokenid"].(string) + "=" + tok["value"].(string)
	if err := e.s.AddRole("PermsOnly", []string{"Permissions.Modify"}); err != nil {
		t.Fatal(err)
	}
	e.ok("PUT", "/access/acl", url.Values{"path": {"/vms/101"}, "users": {"owner@pve"}, "roles": {"PermsOnly"}, "propagate": {"0"}})
	for _, role := range []string{"Administrator", "NoAccess"} {
		r := e.do("PUT", "/access/acl", url.Values{"path": {"/vms/101"}, "users": {"agent@pve"}, "roles": {role}}, authNone, "Authorization", auth)
		if r.status != 200 || !hasACL(e, "/vms/101", "agent@pve", role) {
			t.Errorf("grant of %s by a Permissions.Modify holder: %d %v, want 200 and written", role, r.status, r.body)
		}
	}
}

// TestACLUpdateNeedsASubject: update_acl's parameter check, before the lock.
func TestACLUpdateNeedsASubject(t *testing.T) {
	e := newEnv(t)
	r := e.do("PUT", "/access/acl", url.Values{"path": {"/vms/100"}, "roles": {"PVEVMUser"}}, authTicket)
	errs := r.errors()
	if r.status != 400 || len(errs) != 3 || !strings.Contains(errs["groups"], "either 'users', 'groups' or 'tokens' is required.") {
		t.Fatalf("no subject: %d %v, want 400 with users, groups and tokens errors", r.status, errs)
	}
}

// TestACLUpdatePrivsepTokenPropagation: a privilege-separated token's
// privileges propagate only where both its own ACL and its user's do
// ($compile_acl_path ANDs the flags), so the token's propagating grant is
// refused while its user's roles there do not propagate, and accepted
// once they do.
func TestACLUpdatePrivsepTokenPropagation(t *testing.T) {
	e, _ := builderEnv(t)
	tok, _ := e.ok("POST", "/access/users/builder@pve/token/sep", url.Values{"privsep": {"1"}}).(map[string]any)
	full := tok["full-tokenid"].(string)
	auth := "PVEAPIToken=" + full + "=" + tok["value"].(string)
	e.ok("PUT", "/access/acl", url.Values{"path": {"/vms/100"}, "tokens": {full}, "roles": {"PVEVMAdmin"}})
	grant := url.Values{"path": {"/vms/100"}, "users": {"agent@pve"}, "roles": {"PVEVMUser"}}
	r := e.do("PUT", "/access/acl", grant, authNone, "Authorization", auth)
	want := aclRefusal("role", "Cannot add role 'PVEVMUser' with propagation - requires 'Permissions.Modify' or propagated superset of privileges.")
	if r.status != 500 || r.body["message"] != want {
		t.Fatalf("propagating grant with the user's roles not propagating: %d %q, want 500 %q", r.status, r.body["message"], want)
	}
	e.ok("PUT", "/access/acl", url.Values{"path": {"/vms/100"}, "users": {"builder@pve"}, "roles": {"PVEVMAdmin"}})
	if r := e.do("PUT", "/access/acl", grant, authNone, "Authorization", auth); r.status != 200 || !hasACL(e, "/vms/100", "agent@pve", "PVEVMUser") {
		t.Fatalf("propagating grant with both propagating: %d %v, want 200 and written", r.status, r.body)
	}
}
