package pveemu

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
)

type user struct {
	id       string
	password string
	enable   bool
	comment  string
	tokens   map[string]*token
}

type token struct {
	id      string // the part after "!"
	secret  string
	privsep bool
	comment string
	expire  int64
}

type aclEntry struct {
	path      string
	kind      string // "user", "group" or "token"
	ugid      string
	role      string
	propagate bool
}

// RootToken creates an API token for root@pam without privilege
// separation (full rights) and returns its full id and secret; use it as
// "Authorization: PVEAPIToken=<fullID>=<secret>".
func (s *Server) RootToken(name string) (fullID, secret string, err error) {
	return s.AddToken("root@pam", name, false)
}

// AddUser creates a user (userid "name@realm") with a password.
func (s *Server) AddUser(userid, password string) error {
	if err := verifyUsername(userid); err != nil {
		return fmt.Errorf("pveemu: add user: %s", strings.TrimSpace(err.Error()))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.users[userid]; ok {
		return fmt.Errorf("pveemu: user %s already exists", userid)
	}
	s.users[userid] = &user{id: userid, password: password, enable: true, tokens: map[string]*token{}}
	return nil
}

// AddToken creates an API token for an existing user and returns its full id
// ("user@realm!name") and secret. With privsep the token's rights are the
// intersection of the user's and the token's own ACLs.
func (s *Server) AddToken(userid, name string, privsep bool) (fullID, secret string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addTokenLocked(userid, name, privsep, "", 0)
}

func (s *Server) addTokenLocked(userid, name string, privsep bool, comment string, expire int64) (string, string, error) {
	u, ok := s.users[userid]
	if !ok {
		return "", "", fail("no such user ('%s')", userid)
	}
	if _, ok := u.tokens[name]; ok {
		return "", "", fail("Token already exists.")
	}
	full := userid + "!" + name
	if !reTokenID.MatchString(full) {
		return "", "", fail("value '%s' does not look like a valid token ID", full)
	}
	secret := fmt.Sprintf("%s-%s-%s-%s-%s", randomHex(4), randomHex(2), randomHex(2), randomHex(2), randomHex(6))
	u.tokens[name] = &token{id: name, secret: secret, privsep: privsep, comment: comment, expire: expire}
	return full, secret, nil
}

// SetACL grants role on path to a user ("name@realm"), a token
// ("name@realm!tok") or a group ("@group" is not supported: users and
// tokens only).
func (s *Server) SetACL(path, ugid, role string, propagate bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	kind := "user"
	if strings.Contains(ugid, "!") {
		kind = "token"
	}
	return s.setACLLocked(normalizePath(path), kind, ugid, role, propagate)
}

// DeleteACL takes role on path back from a user or a token, as `pveum acl
// delete PATH --users|--tokens UGID --roles ROLE` does (nothing when there
// is no such entry).
func (s *Server) DeleteACL(path, ugid, role string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kind := "user"
	if strings.Contains(ugid, "!") {
		kind = "token"
	}
	s.deleteACLLocked(normalizePath(path), kind, ugid, role)
}

func (s *Server) deleteACLLocked(path, kind, ugid, role string) {
	s.acl = slices.DeleteFunc(s.acl, func(e aclEntry) bool {
		return e.path == path && e.kind == kind && e.ugid == ugid && e.role == role
	})
}

// AddRole creates (or, existing and not built in, replaces) a role with
// the given privileges, as `pveum role add/modify ROLE --privs` does; an
// unknown privilege is refused as Proxmox refuses it.
func (s *Server) AddRole(name string, privs []string) error {
	if _, ok := roles[name]; ok {
		return fmt.Errorf("pveemu: add role: cannot modify built-in role '%s'", name)
	}
	set := map[string]bool{}
	for _, p := range privs {
		if !validPrivs[p] {
			return fmt.Errorf("pveemu: add role %s: invalid privilege '%s'", name, p)
		}
		set[p] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.customRoles[name] = set
	return nil
}

func (s *Server) setACLLocked(path, kind, ugid, role string, propagate bool) error {
	if s.rolePrivsLocked(role) == nil {
		return fail("role '%s' does not exist", role)
	}
	if err := s.subjectExistsLocked(kind, ugid); err != nil {
		return err
	}
	for i, e := range s.acl {
		if e.path == path && e.kind == kind && e.ugid == ugid && e.role == role {
			s.acl[i].propagate = propagate
			return nil
		}
	}
	s.acl = append(s.acl, aclEntry{path: path, kind: kind, ugid: ugid, role: role, propagate: propagate})
	return nil
}

// subjectExistsLocked is update_acl's check of a user ("user '%s' does not
// exist") or a token (check_token_exist).
func (s *Server) subjectExistsLocked(kind, ugid string) error {
	switch kind {
	case "user":
		if _, ok := s.users[ugid]; !ok {
			return fail("user '%s' does not exist", ugid)
		}
	case "token":
		uid, name, _ := strings.Cut(ugid, "!")
		if u, ok := s.users[uid]; !ok || u.tokens[name] == nil {
			return fail("no such token '%s' for user '%s'", name, uid)
		}
	}
	return nil
}

func normalizePath(p string) string {
	p = "/" + strings.Trim(regexp.MustCompile(`/+`).ReplaceAllString(p, "/"), "/")
	return p
}

func (s *Server) getUsers(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, id := range sortedKeys(s.users) {
		u := s.users[id]
		if rq.authid != "root@pam" && !s.privilegesLocked(rq.authid, "/access/groups")["User.Modify"] && id != strings.SplitN(rq.authid, "!", 2)[0] {
			continue
		}
		e := map[string]any{"userid": id, "enable": boolInt(u.enable)}
		if rq.bool("full", false) {
			var toks []map[string]any
			for _, t := range sortedKeys(u.tokens) {
				toks = append(toks, map[string]any{"tokenid": t, "privsep": boolInt(u.tokens[t].privsep)})
			}
			e["tokens"] = toks
		}
		out = append(out, e)
	}
	return out, nil
}

func (s *Server) postUser(_ context.Context, rq *request) (any, error) {
	id := rq.str("userid")
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.users[id]; ok {
		return nil, fail("create user failed: user '%s' already exists", id)
	}
	s.users[id] = &user{id: id, password: rq.str("password"), enable: rq.bool("enable", true), comment: rq.str("comment"), tokens: map[string]*token{}}
	return nil, nil
}

func (s *Server) postToken(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	full, secret, err := s.addTokenLocked(rq.str("userid"), rq.str("tokenid"), rq.bool("privsep", true), rq.str("comment"), int64(rq.int("expire", 0)))
	if err != nil {
		return nil, err
	}
	return map[string]any{"full-tokenid": full, "value": secret, "info": map[string]any{"privsep": boolInt(rq.bool("privsep", true))}}, nil
}

func (s *Server) deleteToken(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.users[rq.str("userid")]
	if u == nil {
		return nil, fail("no such user ('%s')", rq.str("userid"))
	}
	name := rq.str("tokenid")
	if u.tokens[name] == nil {
		return nil, fail("no such token '%s' for user '%s'", name, u.id)
	}
	delete(u.tokens, name)
	full := u.id + "!" + name
	kept := s.acl[:0]
	for _, e := range s.acl {
		if !(e.kind == "token" && e.ugid == full) {
			kept = append(kept, e)
		}
	}
	s.acl = kept
	return nil, nil
}

func (s *Server) getACL(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, e := range s.acl {
		if rq.authid != "root@pam" && !s.privilegesLocked(rq.authid, e.path)["Permissions.Modify"] {
			continue
		}
		out = append(out, map[string]any{"path": e.path, "type": e.kind, "ugid": e.ugid, "roleid": e.role, "propagate": boolInt(e.propagate)})
	}
	return out, nil
}

func (s *Server) getRoles(_ context.Context, _ *request) (any, error) {
	out := []map[string]any{}
	for _, r := range sortedKeys(roles) {
		privs := sortedKeys(roles[r])
		out = append(out, map[string]any{"roleid": r, "privs": strings.Join(privs, ","), "special": 1})
	}
	s.mu.Lock()
	for _, r := range sortedKeys(s.customRoles) {
		out = append(out, map[string]any{"roleid": r, "privs": strings.Join(sortedKeys(s.customRoles[r]), ","), "special": 0})
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i]["roleid"].(string) < out[j]["roleid"].(string) })
	return out, nil
}
