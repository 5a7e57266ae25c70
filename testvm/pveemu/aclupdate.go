package pveemu

import (
	"context"
	"slices"
)

// putACL is PUT /access/acl (pve-access-control src/PVE/API2/ACL.pm
// update_acl). The schema's perm-modify check has passed when it runs; a
// caller without Permissions.Modify on the path (let in by VM.Allocate,
// Pool.Allocate or Datastore.Allocate) may grant or take back only roles
// whose privileges it holds there, propagated when the grant propagates,
// and never NoAccess. Everything after the subject check runs under the
// server's lock as update_acl runs under lock_user_config: the caller's
// privileges are read once, before any change, a failure leaves the ACL as
// it was (user.cfg is written only at the end), and the error is a 500
// "ACL update failed: <error>".
func (s *Server) putACL(_ context.Context, rq *request) (any, error) {
	users := splitList(rq.str("users"))
	groups := splitList(rq.str("groups"))
	tokens := splitList(rq.str("tokens"))
	if len(users)+len(groups)+len(tokens) == 0 {
		msg := "either 'users', 'groups' or 'tokens' is required."
		return nil, paramFail(ParamErrors{"users": msg, "groups": msg, "tokens": msg})
	}
	u := aclUpdate{
		path:      normalizePath(rq.str("path")),
		roles:     splitList(rq.str("roles")),
		propagate: rq.bool("propagate", true),
		del:       rq.bool("delete", false),
		groups:    groups,
		users:     users,
		tokens:    tokens,
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	saved := slices.Clone(s.acl)
	if err := s.updateACLLocked(rq.authid, u); err != nil {
		s.acl = saved
		return nil, lockFail("ACL update failed", err)
	}
	return nil, nil
}

// aclUpdate is one PUT /access/acl request's parameters.
type aclUpdate struct {
	path                  string
	roles                 []string
	propagate, del        bool
	groups, users, tokens []string
}

// updateACLLocked applies u role by role as update_acl's loop does: the
// role must exist, pass the caller's privilege check, then is set on (or
// deleted from) every group, user and token in that order.
func (s *Server) updateACLLocked(authid string, u aclUpdate) error {
	held := s.privilegeFlagsLocked(authid, u.path)
	_, permModify := held["Permissions.Modify"]
	for _, role := range u.roles {
		privs := s.rolePrivsLocked(role)
		if privs == nil {
			return fail("role '%s' does not exist", role)
		}
		if !permModify {
			if err := grantableRole(role, privs, held, u.propagate, u.del); err != nil {
				return err
			}
		}
		// The emulator has no groups: every group named is missing.
		if len(u.groups) > 0 {
			return fail("group '%s' does not exist", u.groups[0])
		}
		for _, kind := range []struct {
			name string
			ids  []string
		}{{"user", u.users}, {"token", u.tokens}} {
			for _, id := range kind.ids {
				if err := s.applyACLLocked(u, kind.name, id, role); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (s *Server) applyACLLocked(u aclUpdate, kind, id, role string) error {
	if !u.del {
		return s.setACLLocked(u.path, kind, id, role, u.propagate)
	}
	if err := s.subjectExistsLocked(kind, id); err != nil {
		return err
	}
	s.deleteACLLocked(u.path, kind, id, role)
	return nil
}

// grantableRole is update_acl's check for a caller without
// Permissions.Modify on the path: every privilege of the role held there
// (held maps each to its propagate flag), propagated when a grant
// propagates (a delete's propagate is not checked), and the role not
// NoAccess. Privileges are checked in name order (Perl's hash order is
// random).
func grantableRole(role string, privs, held map[string]bool, propagate, del bool) error {
	verb := "add"
	if del {
		verb = "remove"
	}
	for _, p := range sortedKeys(privs) {
		prop, ok := held[p]
		if !ok {
			return paramFail(ParamErrors{"role": "Cannot " + verb + " role '" + role + "' - requires 'Permissions.Modify' or superset of privileges."})
		}
		if propagate && !prop && !del {
			return paramFail(ParamErrors{"role": "Cannot " + verb + " role '" + role + "' with propagation - requires 'Permissions.Modify' or propagated superset of privileges."})
		}
	}
	if role == "NoAccess" {
		return paramFail(ParamErrors{"role": "Cannot " + verb + " role '" + role + "' - requires 'Permissions.Modify'"})
	}
	return nil
}
