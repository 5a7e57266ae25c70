package pveemu

import (
	"regexp"
	"strconv"
	"strings"
)

// privilege groups as in PVE::AccessControl (root/admin/user/audit).
var privGroups = map[string][4][]string{
	"VM": {nil,
		{"VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network", "VM.Config.HWType", "VM.Config.Options", "VM.Allocate", "VM.Clone", "VM.GuestAgent.Unrestricted", "VM.Migrate", "VM.Replicate", "VM.Snapshot", "VM.Snapshot.Rollback"},
		{"VM.Config.CDROM", "VM.Config.Cloudinit", "VM.Console", "VM.Backup", "VM.GuestAgent.FileRead", "VM.GuestAgent.FileSystemMgmt", "VM.GuestAgent.FileWrite", "VM.PowerMgmt"},
		{"VM.Audit", "VM.GuestAgent.Audit"}},
	"Sys":       {{"Sys.PowerMgmt", "Sys.Modify", "Sys.Incoming", "Sys.AccessNetwork"}, {"Sys.Console", "Sys.Syslog"}, nil, {"Sys.Audit"}},
	"Datastore": {nil, {"Datastore.Allocate", "Datastore.AllocateTemplate"}, {"Datastore.AllocateSpace"}, {"Datastore.Audit"}},
	"SDN":       {nil, {"SDN.Allocate", "SDN.Audit"}, {"SDN.Use"}, {"SDN.Audit"}},
	"User":      {{"Realm.Allocate"}, {"User.Modify", "Group.Allocate", "Realm.AllocateUser"}, nil, nil},
	"Pool":      {nil, {"Pool.Allocate"}, {"Pool.Audit"}, {"Pool.Audit"}},
	"Mapping":   {nil, {"Mapping.Modify"}, {"Mapping.Use"}, {"Mapping.Audit"}},
}

// validPrivs and roles (the built-in ones) are filled once by init and
// only read afterwards; a server's own roles are in Server.customRoles.
var (
	validPrivs = map[string]bool{"Permissions.Modify": true}
	roles      = map[string]map[string]bool{}
)

func init() {
	all := map[string]bool{"Permissions.Modify": true}
	auditor := map[string]bool{}
	for g, levels := range privGroups {
		admin, userRole := map[string]bool{}, map[string]bool{}
		for i, lv := range levels {
			for _, p := range lv {
				validPrivs[p] = true
				all[p] = true
				if i >= 1 {
					admin[p] = true
				}
				if i >= 2 {
					userRole[p] = true
				}
				if i == 3 {
					auditor[p] = true
				}
			}
		}
		roles["PVE"+g+"Admin"] = admin
		roles["PVE"+g+"User"] = userRole
	}
	roles["Administrator"] = all
	roles["PVEAuditor"] = auditor
	roles["NoAccess"] = map[string]bool{}
}

// ---- permissions (PVE::RPCEnvironment) ----

// privileges returns the privileges authid has on path.
func (s *Server) privileges(authid, path string) map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.privilegesLocked(authid, path)
}

func (s *Server) privilegesLocked(authid, path string) map[string]bool {
	out := map[string]bool{}
	for p := range s.privilegeFlagsLocked(authid, path) {
		out[p] = true
	}
	return out
}

// privilegeFlagsLocked is RPCEnvironment permissions(): the privileges
// authid has on path, each mapped to its propagate flag (true when a role
// granting it was set with propagate; root@pam's are all propagated, roles
// from a pool never are, a privilege-separated token's is the AND of its
// own and its user's). Only the keys say which privileges are held.
func (s *Server) privilegeFlagsLocked(authid, path string) map[string]bool {
	uid, tok, isToken := strings.Cut(authid, "!")
	var userPrivs map[string]bool
	if uid == "root@pam" {
		userPrivs = map[string]bool{}
		for p := range roles["Administrator"] {
			userPrivs[p] = true
		}
	} else {
		userPrivs = s.subjectPrivs("user", uid, path)
	}
	if !isToken {
		return userPrivs
	}
	u := s.users[uid]
	if u == nil || u.tokens[tok] == nil {
		return map[string]bool{}
	}
	if !u.tokens[tok].privsep {
		return userPrivs
	}
	tokPrivs := s.subjectPrivs("token", authid, path)
	out := map[string]bool{}
	for p, prop := range tokPrivs {
		if userProp, ok := userPrivs[p]; ok {
			out[p] = prop && userProp
		}
	}
	return out
}

// subjectPrivs evaluates the ACL tree for one user or token: the most
// specific path with entries wins; entries above the path count only when
// propagating; roles from pools apply to their member VMs. Each privilege
// maps to its propagate flag (RPCEnvironment.pm compile_acl_path: set iff
// any role granting it propagates; a pool's roles never do, nor replace a
// role the path set itself).
func (s *Server) subjectPrivs(kind, id, path string) map[string]bool {
	path = normalizePath(path)
	comps := strings.Split(strings.Trim(path, "/"), "/")
	prefixes := []string{"/"}
	for i := range comps {
		if comps[i] == "" {
			continue
		}
		prefixes = append(prefixes, "/"+strings.Join(comps[:i+1], "/"))
	}
	var current map[string]bool
	for _, p := range prefixes {
		found := map[string]bool{}
		any := false
		for _, e := range s.acl {
			if e.path != p || e.kind != kind || e.ugid != id {
				continue
			}
			if p != path && !e.propagate {
				continue
			}
			found[e.role] = found[e.role] || e.propagate
			any = true
		}
		if any {
			current = found
		}
	}
	roleSet := map[string]bool{}
	for r, prop := range current {
		roleSet[r] = prop
	}
	addPoolRoles := func(pool string) {
		for r := range s.subjectRolesExact(kind, id, "/pool/"+pool) {
			if _, ok := roleSet[r]; !ok {
				roleSet[r] = false
			}
		}
	}
	_, noAccess := roleSet["NoAccess"]
	if vmid, ok := strings.CutPrefix(path, "/vms/"); ok && !noAccess {
		if n, err := strconv.Atoi(vmid); err == nil {
			if v := s.vms[n]; v != nil && v.pool != "" {
				addPoolRoles(v.pool)
			}
		}
	}
	// A storage that is a pool member gets the pool's roles too
	// (RPCEnvironment.pm compile_acl_path).
	if sid, ok := strings.CutPrefix(path, "/storage/"); ok && !noAccess {
		for _, pid := range sortedKeys(s.pools) {
			if s.pools[pid].storage[sid] {
				addPoolRoles(pid)
			}
		}
	}
	out := map[string]bool{}
	if _, ok := roleSet["NoAccess"]; ok {
		return out
	}
	for r, prop := range roleSet {
		for p := range s.rolePrivsLocked(r) {
			out[p] = out[p] || prop
		}
	}
	return out
}

// rolePrivsLocked returns the privileges of a built-in or added role (nil
// for none).
func (s *Server) rolePrivsLocked(name string) map[string]bool {
	if r, ok := roles[name]; ok {
		return r
	}
	return s.customRoles[name]
}

func (s *Server) subjectRolesExact(kind, id, path string) map[string]bool {
	out := map[string]bool{}
	// pool roles: ACLs on the pool path or propagated from above it
	comps := strings.Split(strings.Trim(path, "/"), "/")
	var current map[string]bool
	for i := 0; i <= len(comps); i++ {
		p := "/" + strings.Join(comps[:i], "/")
		found := map[string]bool{}
		any := false
		for _, e := range s.acl {
			if e.path == p && e.kind == kind && e.ugid == id && (p == path || e.propagate) {
				found[e.role] = true
				any = true
			}
		}
		if any && p != "/" {
			current = found
		}
	}
	for r := range current {
		out[r] = true
	}
	return out
}

// PermCheck is one privilege check the emulator made for a request
// (RPCEnvironment check or check_any, a schema check's "perm"), as
// RecordPermChecks records them. Listing filters are not checks.
type PermCheck struct {
	AuthID string
	Path   string
	Privs  []string
	// AnyOf: one of Privs was enough.
	AnyOf bool
	// OK: the check passed.
	OK bool
}

// RecordPermChecks makes the server record every privilege check from now
// on (PermChecks).
func (s *Server) RecordPermChecks() {
	s.permMu.Lock()
	s.recordPerms = true
	s.permMu.Unlock()
}

// PermChecks returns the privilege checks recorded so far, in order.
func (s *Server) PermChecks() []PermCheck {
	s.permMu.Lock()
	defer s.permMu.Unlock()
	return append([]PermCheck(nil), s.permLog...)
}

// notePerm records one check when recording is on.
func (s *Server) notePerm(authid, path string, privs []string, anyOf, ok bool) {
	s.permMu.Lock()
	defer s.permMu.Unlock()
	if s.recordPerms {
		s.permLog = append(s.permLog, PermCheck{AuthID: authid, Path: path, Privs: append([]string(nil), privs...), AnyOf: anyOf, OK: ok})
	}
}

// privsCheck is RPCEnvironment check (all of privs) or check_any (anyOf)
// against the privileges have on path.
func (s *Server) privsCheck(authid, path string, have map[string]bool, privs []string, anyOf bool) error {
	var err error
	if anyOf {
		err = permFail(path + ", " + strings.Join(privs, "|"))
		for _, p := range privs {
			if have[p] {
				err = nil
				break
			}
		}
	} else {
		for _, p := range privs {
			if !have[p] {
				err = permFail(path + ", " + p)
				break
			}
		}
	}
	s.notePerm(authid, path, privs, anyOf, err == nil)
	return err
}

func (s *Server) checkPrivs(authid, path string, privs []string, anyOf bool) error {
	return s.privsCheck(authid, path, s.privileges(authid, path), privs, anyOf)
}

func (s *Server) checkPrivsLocked(authid, path string, privs []string) error {
	return s.privsCheck(authid, path, s.privilegesLocked(authid, path), privs, false)
}

func (s *Server) checkAPI2Permissions(perm Permissions, authid string, params map[string]any) error {
	if authid == "" {
		if perm.User == "world" {
			return nil
		}
		return permFail("user != null")
	}
	if authid == "root@pam" {
		return nil
	}
	if perm.User == "all" || perm.User == "world" {
		return nil
	}
	if perm.Check == nil {
		return permFail("user != root@pam")
	}
	_, err := s.execPermCheck(perm.Check, authid, params, false)
	return err
}

var reTemplateVar = regexp.MustCompile(`\{([^}]+)\}`)

// execPermCheck evaluates a schema permission check (PVE::RPCEnvironment
// exec_api2_perm_check); with noerr a refusal is false without an error.
func (s *Server) execPermCheck(check []any, authid string, params map[string]any, noerr bool) (bool, error) {
	if len(check) == 0 {
		return false, permFail("")
	}
	test, _ := check[0].(string)
	switch test {
	case "and":
		for _, sub := range check[1:] {
			sc, _ := sub.([]any)
			if ok, err := s.execPermCheck(sc, authid, params, noerr); !ok {
				return false, err
			}
		}
		return true, nil
	case "or":
		for _, sub := range check[1:] {
			sc, _ := sub.([]any)
			if ok, _ := s.execPermCheck(sc, authid, params, true); ok {
				return true, nil
			}
		}
		if noerr {
			return false, nil
		}
		return false, permFail("")
	case "perm":
		return s.permCheckPerm(check, authid, params, noerr)
	case "userid-param":
		return s.permCheckUserid(check, authid, params, noerr)
	case "userid-group":
		privs := anyStrings(check[1])
		err := s.checkPrivs(authid, "/access/groups", privs, true)
		if err != nil && noerr {
			return false, nil
		}
		return err == nil, err
	case "perm-modify":
		return s.permCheckModify(check, authid, params, noerr)
	}
	return false, permFail("")
}

// permPath is a check's path template with its {param} parts filled in
// from params, normalised.
func permPath(tmpl string, params map[string]any) string {
	return normalizePath(reTemplateVar.ReplaceAllStringFunc(tmpl, func(m string) string {
		v, _ := scalarString(params[strings.Trim(m, "{}")])
		return v
	}))
}

// permCheckPerm is ["perm", path, privs, options...]: the privileges on the
// path, all of them or (with "any") one.
func (s *Server) permCheckPerm(check []any, authid string, params map[string]any, noerr bool) (bool, error) {
	if len(check) < 3 {
		return false, permFail("")
	}
	tmpl, _ := check[1].(string)
	privs := anyStrings(check[2])
	anyOf := false
	for i := 3; i+1 < len(check); i += 2 {
		k, _ := check[i].(string)
		switch k {
		case "any":
			anyOf = truthy(check[i+1])
		case "require_param":
			rp, _ := check[i+1].(string)
			if params[rp] == nil {
				if noerr {
					return false, nil
				}
				return false, permFail("")
			}
		}
	}
	err := s.checkPrivs(authid, permPath(tmpl, params), privs, anyOf)
	return err == nil, err
}

// permCheckUserid is ["userid-param", "self" | "Realm.AllocateUser"]: the
// user acting on itself, or allowed to allocate users in the realm.
func (s *Server) permCheckUserid(check []any, authid string, params map[string]any, noerr bool) (bool, error) {
	uid, _ := scalarString(params["userid"])
	own, _, _ := strings.Cut(authid, "!")
	if len(check) > 1 && check[1] == "self" && own == uid && !strings.Contains(authid, "!") {
		return true, nil
	}
	if len(check) > 1 && check[1] == "Realm.AllocateUser" {
		_, realm, _ := strings.Cut(uid, "@")
		err := s.checkPrivs(authid, "/access/realm/"+realm, []string{"Realm.AllocateUser"}, false)
		return err == nil, err
	}
	if noerr {
		return false, nil
	}
	return false, permFail("")
}

// permCheckModify is ["perm-modify", path]: Permissions.Modify, or the
// allocate privilege of the path's kind, on the path.
func (s *Server) permCheckModify(check []any, authid string, params map[string]any, noerr bool) (bool, error) {
	tmpl, _ := check[1].(string)
	path := permPath(tmpl, params)
	privs := []string{"Permissions.Modify"}
	switch {
	case strings.HasPrefix(path, "/vms/"):
		privs = append(privs, "VM.Allocate")
	case strings.HasPrefix(path, "/pool/"):
		privs = append(privs, "Pool.Allocate")
	case strings.HasPrefix(path, "/storage/"):
		privs = append(privs, "Datastore.Allocate")
	}
	err := s.checkPrivs(authid, path, privs, true)
	if err != nil && noerr {
		return false, nil
	}
	return err == nil, err
}

func anyStrings(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, x := range l {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func truthy(v any) bool {
	switch t := v.(type) {
	case float64:
		return t != 0
	case bool:
		return t
	case string:
		return t != "" && t != "0"
	}
	return false
}
