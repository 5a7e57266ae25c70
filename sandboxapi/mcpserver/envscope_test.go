package mcpserver_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

// ownedToken is a token of ownedTokens: its name, scopes and owner.
type ownedToken struct {
	name, owner string
	scopes      []string
}

// ownedTokens is a fixed TokenVerifier whose tokens may be bound to an
// owner (as sandboxapi/auth.Store's are).
type ownedTokens map[string]ownedToken

func (t ownedTokens) Verify(tok string) (string, []string, error) {
	n, s, _, err := t.VerifyOwner(tok)
	return n, s, err
}

func (t ownedTokens) VerifyOwner(tok string) (string, []string, string, error) {
	o, ok := t[tok]
	if !ok {
		return "", nil, "", errors.New("unknown token")
	}
	return o.name, o.scopes, o.owner, nil
}

// TestEnvFileScoped: over HTTP the [mcp] env file goes only into the
// sandboxes of a token named in EnvTokens or bound to an owner in
// EnvOwners; an admin token bound to no owner and one of another owner
// create sandboxes without it.
func TestEnvFileScoped(t *testing.T) {
	admin := []string{apitype.ScopeAdmin}
	toks := ownedTokens{
		"a": {name: "ops", scopes: admin},                      // admin, no owner, not named
		"n": {name: "agent-1", scopes: admin},                  // named in EnvTokens
		"o": {name: "alice-ci", owner: "alice", scopes: admin}, // bound to a named owner
		"b": {name: "bob-ci", owner: "bob", scopes: admin},     // bound to another owner
	}
	env := map[string]string{"ANTHROPIC_API_KEY": "sk-ant-not-a-real-key"}
	for _, tc := range []struct {
		name, tok     string
		tokens, owner []string
		want          bool
	}{
		{"unbound admin, nothing named", "a", nil, nil, false},
		{"unbound admin, others named", "a", []string{"agent-1"}, []string{"alice"}, false},
		{"named token", "n", []string{"agent-1"}, nil, true},
		{"named owner", "o", nil, []string{"alice"}, true},
		{"other owner", "b", []string{"agent-1"}, []string{"alice"}, false},
		{"token name is not an owner", "o", []string{"alice"}, nil, false},
		{"owner is not a token name", "n", nil, []string{"agent-1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBed(t, bedOpts{tokens: toks})
			o := mcpserver.Options{DefaultTemplate: "debian", Env: env, EnvTokens: tc.tokens, EnvOwners: tc.owner}
			if err := o.Validate(); err != nil {
				t.Fatal(err)
			}
			h := mcpserver.HTTPHandler(toks, func(tok string) mcpserver.API {
				return client.NewInProcess(b.srv.Handler(), client.WithToken(tok))
			}, o)
			hs := httptest.NewServer(h)
			t.Cleanup(hs.Close)
			s := b.connect(b.ctx(), &mcp.StreamableClientTransport{Endpoint: hs.URL, HTTPClient: &http.Client{Transport: testkit.Bearer{Token: tc.tok}}})
			sb := ok[apitype.Sandbox](t, "create", callOn(t, b.ctx(), s, mcpserver.ToolCreate, nil))
			out := ok[mcpserver.ExecOutput](t, "cat", callOn(t, b.ctx(), s, mcpserver.ToolExec, map[string]any{"id": sb.ID, "argv": []string{"cat", apitype.GuestEnvPath}}))
			got := out.ExitCode == 0
			if got != tc.want {
				t.Fatalf("env file in the sandbox of token %q: %v (exit %d, %q), want %v", toks[tc.tok].name, got, out.ExitCode, out.Stdout, tc.want)
			}
			if want := string(apitype.EnvFile(env)); got && out.Stdout != want {
				t.Errorf("env file %q, want %q", out.Stdout, want)
			}
		})
	}
}
