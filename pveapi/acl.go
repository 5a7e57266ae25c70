package pveapi

import (
	"context"
	"strings"
)

// GrantACL gives role on path to users and API tokens (full ids
// user@realm!name), propagating or not: PUT /access/acl
// (pve-access-control PVE/API2/ACL.pm update_acl; the caller needs
// Permissions.Modify on path, which root@pam has). A token with privilege
// separation holds what both it and its user hold, so a grant meant for
// a token names its user too. Granting what is granted already changes
// nothing.
func (c *Client) GrantACL(ctx context.Context, path, role string, users, tokens []string, propagate bool) error {
	body := map[string]any{"path": path, "roles": role, "propagate": 0}
	if propagate {
		body["propagate"] = 1
	}
	if len(users) > 0 {
		body["users"] = strings.Join(users, ",")
	}
	if len(tokens) > 0 {
		body["tokens"] = strings.Join(tokens, ",")
	}
	return c.call(ctx, "PUT", "grant "+role+" on "+path, "/access/acl", body)
}
