package pveemu

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

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
