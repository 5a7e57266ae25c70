package mcpserver

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TokenVerifier checks a bearer token and returns its name and scopes
// (sandboxapi/auth.Store implements it).
type TokenVerifier interface {
	Verify(token string) (name string, scopes []string, err error)
}

// OwnerVerifier is a TokenVerifier whose tokens may be bound to an owner
// (sandboxapi/auth.Store implements it); HTTPHandler uses it, when the
// verifier has it, to match Options.EnvOwners.
type OwnerVerifier interface {
	VerifyOwner(token string) (name string, scopes []string, owner string, err error)
}

// caller is the authenticated caller of one HTTP request.
type caller struct {
	token, name, owner string
	scopes             []string
}

// verify checks tok with tokens, and its owner when tokens knows owners.
func verify(tokens TokenVerifier, tok string) (caller, error) {
	c := caller{token: tok}
	var err error
	if ov, ok := tokens.(OwnerVerifier); ok {
		c.name, c.scopes, c.owner, err = ov.VerifyOwner(tok)
	} else {
		c.name, c.scopes, err = tokens.Verify(tok)
	}
	return c, err
}

type callerKey struct{}

// sessionIdle closes an HTTP session after this long without a request.
const sessionIdle = time.Hour

// HTTPHandler serves MCP over streamable HTTP (mount it at /v1/mcp). Every
// request must carry a bearer token that tokens accepts; a session's tools
// are those of the token that opened it and they call the API built by
// apiFor with that token (the in-process client), so the API enforces the
// scopes again. A session is bound to the token that opened it: a request
// on it with another token is refused, and a revoked token ends its use at
// the next request. Options.Env goes only with the creates of sessions
// opened by a token that EnvTokens or EnvOwners names. Sessions let a
// client's cancellation reach the call it cancels; idle ones close after an
// hour.
func HTTPHandler(tokens TokenVerifier, apiFor func(token string) API, o Options) http.Handler {
	o.defaults()
	sh := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		c, ok := r.Context().Value(callerKey{}).(caller)
		if !ok {
			return nil
		}
		return New(apiFor(c.token), o.envFor(c.name, c.owner), c.scopes...)
	}, &mcp.StreamableHTTPOptions{SessionTimeout: sessionIdle, Logger: o.Logger, MaxRequestBodyBytes: max(MaxMessageBytes(o), mcp.DefaultMaxRequestBodyBytes)})
	owners := &sessionOwners{m: map[string]sessionOwner{}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			unauthorized(w, "a bearer token is required")
			return
		}
		if tokens == nil {
			unauthorized(w, "token authentication is not configured")
			return
		}
		c, err := verify(tokens, tok)
		if err != nil || rank(c.scopes) == 0 {
			unauthorized(w, "invalid token")
			return
		}
		sum := sha256.Sum256([]byte(tok))
		if sid := r.Header.Get(sessionHeader); sid != "" {
			if !owners.check(sid, sum) {
				writeProblem(w, http.StatusNotFound, apitype.ProblemNotFound, "no MCP session "+sid+" for this token")
				return
			}
		} else {
			w = &sessionRecorder{ResponseWriter: w, owners: owners, sum: sum}
		}
		o.Logger.Debug("mcp request", "token", c.name, "method", r.Method)
		sh.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)))
	})
}

// sessionHeader carries the MCP session id.
const sessionHeader = "Mcp-Session-Id"

// sessionOwner is the token (its hash) that opened a session.
type sessionOwner struct {
	sum  [32]byte
	seen time.Time
}

// sessionOwners maps session ids to the token that opened them.
type sessionOwners struct {
	mu sync.Mutex // guards m
	m  map[string]sessionOwner
}

// add records a new session and forgets idle ones.
func (s *sessionOwners) add(sid string, sum [32]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for k, v := range s.m {
		if now.Sub(v.seen) > sessionIdle {
			delete(s.m, k)
		}
	}
	s.m[sid] = sessionOwner{sum: sum, seen: now}
}

// check reports whether sid was opened with the token of sum.
func (s *sessionOwners) check(sid string, sum [32]byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[sid]
	if !ok || subtle.ConstantTimeCompare(v.sum[:], sum[:]) != 1 {
		return false
	}
	v.seen = time.Now()
	s.m[sid] = v
	return true
}

// sessionRecorder notes the session id the SDK assigns in its answer.
type sessionRecorder struct {
	http.ResponseWriter
	owners *sessionOwners
	sum    [32]byte
	done   bool
}

func (s *sessionRecorder) WriteHeader(code int) {
	if !s.done {
		s.done = true
		if sid := s.Header().Get(sessionHeader); sid != "" {
			s.owners.add(sid, s.sum)
		}
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *sessionRecorder) Write(b []byte) (int, error) {
	if !s.done {
		s.WriteHeader(http.StatusOK)
	}
	return s.ResponseWriter.Write(b)
}

// Flush passes on flushes (the SSE stream needs them).
func (s *sessionRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the real writer.
func (s *sessionRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func unauthorized(w http.ResponseWriter, detail string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="pve-inspectd"`)
	writeProblem(w, http.StatusUnauthorized, apitype.ProblemUnauthorized, detail)
}

func writeProblem(w http.ResponseWriter, status int, typ, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(apitype.Problem{Type: typ, Title: http.StatusText(status), Status: status, Detail: detail})
}
