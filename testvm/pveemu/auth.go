package pveemu

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
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

// ---- tickets and CSRF tokens (same shape as PVE::Ticket's) ----

const ticketLifetime = 2 * time.Hour

func (s *Server) sign(data string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(data))
	return base64.RawStdEncoding.EncodeToString(m.Sum(nil))
}

func (s *Server) mintTicket(userid string, now time.Time) (ticket, csrf string) {
	ts := fmt.Sprintf("%08X", now.Unix())
	data := "PVE:" + userid + ":" + ts
	ticket = data + "::" + s.sign(data)
	csrf = ts + ":" + s.sign("csrf:"+ts+":"+userid)
	return ticket, csrf
}

func (s *Server) verifyTicket(ticket string) (string, bool) {
	data, sig, ok := strings.Cut(ticket, "::")
	if !ok || !hmac.Equal([]byte(sig), []byte(s.sign(data))) {
		return "", false
	}
	parts := strings.Split(data, ":")
	if len(parts) != 3 || parts[0] != "PVE" {
		return "", false
	}
	ts, err := strconv.ParseInt(parts[2], 16, 64)
	if err != nil {
		return "", false
	}
	age := time.Since(time.Unix(ts, 0))
	if age < -5*time.Minute || age > ticketLifetime {
		return "", false
	}
	return parts[1], true
}

func (s *Server) verifyCSRF(userid, tok string) bool {
	ts, sig, ok := strings.Cut(tok, ":")
	if !ok || len(ts) != 8 {
		return false
	}
	if !hmac.Equal([]byte(sig), []byte(s.sign("csrf:"+ts+":"+userid))) {
		return false
	}
	t, err := strconv.ParseInt(ts, 16, 64)
	if err != nil {
		return false
	}
	age := time.Since(time.Unix(t, 0))
	return age > -5*time.Minute && age < ticketLifetime
}

// RootTicket mints a ticket and CSRF prevention token for root@pam.
func (s *Server) RootTicket() (ticket, csrf string) { return s.mintTicket("root@pam", time.Now()) }

// Ticket mints a ticket and CSRF token for an existing, enabled user.
func (s *Server) Ticket(userid string) (ticket, csrf string, err error) {
	s.mu.Lock()
	u, ok := s.users[userid]
	s.mu.Unlock()
	if !ok || !u.enable {
		return "", "", fmt.Errorf("pveemu: no enabled user %q", userid)
	}
	t, c := s.mintTicket(userid, time.Now())
	return t, c, nil
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

func (s *Server) setACLLocked(path, kind, ugid, role string, propagate bool) error {
	if _, ok := roles[role]; !ok {
		return fail("role '%s' does not exist", role)
	}
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
	for i, e := range s.acl {
		if e.path == path && e.kind == kind && e.ugid == ugid && e.role == role {
			s.acl[i].propagate = propagate
			return nil
		}
	}
	s.acl = append(s.acl, aclEntry{path: path, kind: kind, ugid: ugid, role: role, propagate: propagate})
	return nil
}

func normalizePath(p string) string {
	p = "/" + strings.Trim(regexp.MustCompile(`/+`).ReplaceAllString(p, "/"), "/")
	return p
}

// ---- authentication (PVE::HTTPServer::auth_handler) ----

func extractAuthValue(header, name string) string {
	for _, part := range strings.Split(header, ";") {
		part = strings.TrimSpace(part)
		if v, ok := strings.CutPrefix(part, name+"="); ok {
			return v
		}
	}
	return ""
}

func (s *Server) authenticate(r *http.Request, rel string) (authid string, isToken bool, err error) {
	if rel == "/access/ticket" && (r.Method == http.MethodPost || r.Method == http.MethodGet) {
		return "", false, nil
	}
	unauthorized := func(msg string) error {
		return &apiError{code: http.StatusUnauthorized, msg: msg + "\n", bare: true}
	}
	ticket := ""
	for _, c := range r.Header.Values("Cookie") {
		if v := extractAuthValue(c, "PVEAuthCookie"); v != "" {
			ticket = v
		}
	}
	authz := r.Header.Get("Authorization")
	if ticket == "" {
		ticket = extractAuthValue(authz, "PVEAuthCookie")
	}
	if ticket == "" {
		if apiToken := extractAuthValue(authz, "PVEAPIToken"); apiToken != "" {
			id, ok := s.verifyToken(apiToken)
			if !ok {
				return "", false, unauthorized("Authentication failed!")
			}
			return id, true, nil
		}
	}
	if ticket == "" {
		return "", false, unauthorized("No ticket")
	}
	ticket, _ = urlUnescape(ticket)
	userid, ok := s.verifyTicket(ticket)
	s.mu.Lock()
	u := s.users[userid]
	s.mu.Unlock()
	if !ok || u == nil || !u.enable {
		return "", false, unauthorized("Authentication failed!")
	}
	if r.Method != http.MethodGet && !s.verifyCSRF(userid, r.Header.Get("CSRFPreventionToken")) {
		return "", false, &apiError{code: http.StatusUnauthorized, msg: "Permission denied - invalid csrf token\n", bare: true}
	}
	return userid, false, nil
}

func urlUnescape(s string) (string, error) {
	return unescapeForm(strings.ReplaceAll(s, "+", "%2B")), nil
}

func (s *Server) verifyToken(v string) (string, bool) {
	i := strings.LastIndex(v, "=")
	if i < 0 {
		return "", false
	}
	full, secret := v[:i], v[i+1:]
	m := reTokenID.FindStringSubmatch(full)
	if m == nil {
		return "", false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.users[m[1]]
	if !ok || !u.enable {
		return "", false
	}
	t, ok := u.tokens[m[2]]
	if !ok || subtle.ConstantTimeCompare([]byte(t.secret), []byte(secret)) != 1 {
		return "", false
	}
	if t.expire != 0 && time.Now().Unix() > t.expire {
		return "", false
	}
	return full, true
}

// ---- permissions (PVE::RPCEnvironment) ----

// privileges returns the privileges authid has on path.
func (s *Server) privileges(authid, path string) map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.privilegesLocked(authid, path)
}

func (s *Server) privilegesLocked(authid, path string) map[string]bool {
	uid, tok, isToken := strings.Cut(authid, "!")
	if uid == "root@pam" && !isToken {
		return roles["Administrator"]
	}
	userPrivs := s.subjectPrivs("user", uid, path)
	if uid == "root@pam" {
		userPrivs = roles["Administrator"]
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
	for p := range tokPrivs {
		if userPrivs[p] {
			out[p] = true
		}
	}
	return out
}

// subjectPrivs evaluates the ACL tree for one user or token: the most
// specific path with entries wins; entries above the path count only when
// propagating; roles from pools apply to their member VMs.
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
			found[e.role] = true
			any = true
		}
		if any {
			current = found
		}
	}
	roleSet := map[string]bool{}
	for r := range current {
		roleSet[r] = true
	}
	if vmid, ok := strings.CutPrefix(path, "/vms/"); ok && !roleSet["NoAccess"] {
		if n, err := strconv.Atoi(vmid); err == nil {
			if v := s.vms[n]; v != nil && v.pool != "" {
				for r := range s.subjectRolesExact(kind, id, "/pool/"+v.pool) {
					roleSet[r] = true
				}
			}
		}
	}
	// A storage that is a pool member gets the pool's roles too
	// (RPCEnvironment.pm compile_acl_path).
	if sid, ok := strings.CutPrefix(path, "/storage/"); ok && !roleSet["NoAccess"] {
		for _, pid := range sortedKeys(s.pools) {
			if s.pools[pid].storage[sid] {
				for r := range s.subjectRolesExact(kind, id, "/pool/"+pid) {
					roleSet[r] = true
				}
			}
		}
	}
	out := map[string]bool{}
	if roleSet["NoAccess"] {
		return out
	}
	for r := range roleSet {
		for p := range roles[r] {
			out[p] = true
		}
	}
	return out
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

func (s *Server) checkPrivs(authid, path string, privs []string, anyOf bool) error {
	have := s.privileges(authid, path)
	if anyOf {
		for _, p := range privs {
			if have[p] {
				return nil
			}
		}
		return permFail(path + ", " + strings.Join(privs, "|"))
	}
	for _, p := range privs {
		if !have[p] {
			return permFail(path + ", " + p)
		}
	}
	return nil
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
		path := reTemplateVar.ReplaceAllStringFunc(tmpl, func(m string) string {
			v, _ := scalarString(params[strings.Trim(m, "{}")])
			return v
		})
		err := s.checkPrivs(authid, normalizePath(path), privs, anyOf)
		return err == nil, err
	case "userid-param":
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
	case "userid-group":
		privs := anyStrings(check[1])
		err := s.checkPrivs(authid, "/access/groups", privs, true)
		if err != nil && noerr {
			return false, nil
		}
		return err == nil, err
	case "perm-modify":
		tmpl, _ := check[1].(string)
		path := normalizePath(reTemplateVar.ReplaceAllStringFunc(tmpl, func(m string) string {
			v, _ := scalarString(params[strings.Trim(m, "{}")])
			return v
		}))
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
	return false, permFail("")
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

// ---- /access handlers ----

func (s *Server) postTicket(_ context.Context, rq *request) (any, error) {
	username := rq.str("username")
	if realm := rq.str("realm"); realm != "" && !strings.Contains(username, "@") {
		username += "@" + realm
	}
	s.mu.Lock()
	u := s.users[username]
	ok := u != nil && u.enable && ((username == "root@pam" && subtle.ConstantTimeCompare([]byte(rq.str("password")), []byte(s.pwdRoot)) == 1) ||
		(username != "root@pam" && u.password != "" && subtle.ConstantTimeCompare([]byte(rq.str("password")), []byte(u.password)) == 1))
	s.mu.Unlock()
	if !ok {
		return nil, &apiError{code: http.StatusUnauthorized, msg: "authentication failure\n"}
	}
	ticket, csrf := s.mintTicket(username, time.Now())
	return map[string]any{"username": username, "ticket": ticket, "CSRFPreventionToken": csrf, "cap": map[string]any{}}, nil
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

func (s *Server) putACL(_ context.Context, rq *request) (any, error) {
	path := normalizePath(rq.str("path"))
	rolesList := splitList(rq.str("roles"))
	propagate := rq.bool("propagate", true)
	del := rq.bool("delete", false)
	var subjects [][2]string
	for _, u := range splitList(rq.str("users")) {
		subjects = append(subjects, [2]string{"user", u})
	}
	for _, t := range splitList(rq.str("tokens")) {
		subjects = append(subjects, [2]string{"token", t})
	}
	if len(splitList(rq.str("groups"))) > 0 {
		return nil, fail("groups are not supported by the emulator")
	}
	if len(subjects) == 0 {
		return nil, fail("either 'users', 'groups' or 'tokens' is required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sub := range subjects {
		for _, r := range rolesList {
			if del {
				kept := s.acl[:0]
				for _, e := range s.acl {
					if !(e.path == path && e.kind == sub[0] && e.ugid == sub[1] && e.role == r) {
						kept = append(kept, e)
					}
				}
				s.acl = kept
				continue
			}
			if err := s.setACLLocked(path, sub[0], sub[1], r, propagate); err != nil {
				return nil, err
			}
		}
	}
	return nil, nil
}

func (s *Server) getRoles(_ context.Context, _ *request) (any, error) {
	out := []map[string]any{}
	for _, r := range sortedKeys(roles) {
		privs := sortedKeys(roles[r])
		out = append(out, map[string]any{"roleid": r, "privs": strings.Join(privs, ","), "special": 1})
	}
	sort.Slice(out, func(i, j int) bool { return out[i]["roleid"].(string) < out[j]["roleid"].(string) })
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range reListSep.Split(s, -1) {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
