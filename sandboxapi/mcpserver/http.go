package mcpserver

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pve-inspect/pve-inspect/sandboxapi"
)

// TokenVerifier checks a bearer token and returns its name and scopes
// (sandboxapi/auth.Store implements it).
type TokenVerifier interface {
	Verify(token string) (name string, scopes []string, err error)
}

// caller is the authenticated caller of one HTTP request.
type caller struct {
	token  string
	scopes []string
}

type callerKey struct{}

// HTTPHandler serves MCP over streamable HTTP (mount it at /v1/mcp). Every
// request must carry a bearer token that tokens accepts; its tools are those
// of the token's scopes and they call the API built by apiFor with the same
// token (the in-process client), so the API enforces the scopes again. The
// server is stateless: no session outlives its request.
func HTTPHandler(tokens TokenVerifier, apiFor func(token string) API, o Options) http.Handler {
	o.defaults()
	sh := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		c, ok := r.Context().Value(callerKey{}).(caller)
		if !ok {
			return nil
		}
		return New(apiFor(c.token), o, c.scopes...)
	}, &mcp.StreamableHTTPOptions{Stateless: true, Logger: o.Logger})
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
		name, scopes, err := tokens.Verify(tok)
		if err != nil || rank(scopes) == 0 {
			unauthorized(w, "invalid token")
			return
		}
		o.Logger.Debug("mcp request", "token", name, "method", r.Method)
		sh.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, caller{token: tok, scopes: scopes})))
	})
}

func unauthorized(w http.ResponseWriter, detail string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="pve-inspectd"`)
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusUnauthorized)
	_ = json.NewEncoder(w).Encode(sandboxapi.Problem{Type: sandboxapi.ProblemUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: detail})
}
