package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

// TestTCPHandler: the TCP handler serves the API and, with [mcp] http, the
// MCP server at /v1/mcp behind the token file's tokens; without it,
// /v1/mcp is the API's not-found.
func TestTCPHandler(t *testing.T) {
	tokFile := filepath.Join(t.TempDir(), "tokens.json")
	store := auth.Open(tokFile)
	admin, _, err := store.Create("agent", []string{"admin"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	read, _, err := store.Create("viewer", []string{"read"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	srv := newAPIServer(t, store)
	c := config.Default()
	c.API.TokenFile = tokFile
	c.MCP.DefaultTemplate = "debian"
	for _, on := range []bool{true, false} {
		c.MCP.HTTP = on
		h, err := TCPHandler(srv, c.API, c.MCP, "test", slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(h)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		// the API itself still answers
		req, _ := http.NewRequestWithContext(ctx, "GET", hs.URL+"/v1/healthz", nil)
		req.Header.Set("Authorization", "Bearer "+read)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("healthz: %v %v", resp, err)
		}
		resp.Body.Close()
		cl := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
		session := func(tok string) (*mcp.ClientSession, error) {
			return cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: hs.URL + MCPPath, HTTPClient: &http.Client{Transport: testkit.Bearer{Token: tok}}}, nil)
		}
		cs, err := session(admin)
		if !on {
			if err == nil {
				t.Error("/v1/mcp answers with [mcp] http = false")
			}
			cancel()
			hs.Close()
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpserver.ToolCreate, Arguments: map[string]any{}})
		if err != nil || res.IsError {
			t.Fatalf("create: %v %+v", err, res)
		}
		if owner := res.StructuredContent.(map[string]any)["owner"]; owner != "agent" {
			t.Errorf("owner %v, want the token's name", owner)
		}
		rs, err := session(read)
		if err != nil {
			t.Fatal(err)
		}
		l, err := rs.ListTools(ctx, nil)
		if err != nil || len(l.Tools) != 3 {
			t.Errorf("read token tools: %d %v", len(l.Tools), err)
		}
		_ = cs.Close()
		_ = rs.Close()
		cancel()
		hs.Close()
	}
}

// newAPIServer is a sandbox API on the apitest fakes behind store's tokens.
func newAPIServer(t *testing.T, store *auth.Store) *sandboxapi.Server {
	t.Helper()
	g := apitest.NewGuests()
	eng, err := sandbox.New(sandbox.Options{
		Node:     "n1",
		Proxmox:  apitest.NewProxmox(g, map[string]int{"debian": 9000}),
		Guests:   g.Dial,
		StateDir: t.TempDir(),
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sandboxapi.New(eng, sandboxapi.Options{
		Tokens: store,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// TestTCPHandlerEnvFile: [mcp] env_file goes over /v1/mcp only into the
// sandboxes of the tokens env_file_owners and env_file_tokens name (the
// token file's owner-bound tokens); an admin token bound to no owner, and
// a token of another owner, create sandboxes without it.
func TestTCPHandlerEnvFile(t *testing.T) {
	dir := t.TempDir()
	store := auth.Open(filepath.Join(dir, "tokens.json"))
	toks := map[string]string{}
	for _, tk := range []struct{ name, owner string }{{"ops", ""}, {"alice-ci", "alice"}, {"bob-ci", "bob"}, {"agent-1", ""}} {
		tok, _, err := store.CreateOwned(tk.name, tk.owner, []string{"admin"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		toks[tk.name] = tok
	}
	envFile := filepath.Join(dir, "mcp.env")
	if err := os.WriteFile(envFile, []byte("ANTHROPIC_API_KEY=sk-not-a-real-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(fmt.Sprintf("[api]\ntoken_file = %q\n[mcp]\ndefault_template = \"debian\"\nenv_file = %q\nenv_file_owners = [\"alice\"]\nenv_file_tokens = [\"agent-1\"]\n",
		filepath.Join(dir, "tokens.json"), envFile))
	if err != nil {
		t.Fatal(err)
	}
	h, err := TCPHandler(newAPIServer(t, store), c.API, c.MCP, "test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(h)
	defer hs.Close()
	for name, want := range map[string]bool{"ops": false, "alice-ci": true, "bob-ci": false, "agent-1": true} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: hs.URL + MCPPath, HTTPClient: &http.Client{Transport: testkit.Bearer{Token: toks[name]}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpserver.ToolCreate, Arguments: map[string]any{}})
		if err != nil || res.IsError {
			t.Fatalf("%s: create: %v %+v", name, err, res)
		}
		id := res.StructuredContent.(map[string]any)["id"]
		res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpserver.ToolExec, Arguments: map[string]any{"id": id, "argv": []string{"cat", apitype.GuestEnvPath}}})
		if err != nil || res.IsError {
			t.Fatalf("%s: exec: %v %+v", name, err, res)
		}
		out := res.StructuredContent.(map[string]any)
		if got := out["exit_code"] == float64(0); got != want {
			t.Errorf("token %s: env file in its sandbox %v (%v), want %v", name, got, out, want)
		}
		_ = cs.Close()
		cancel()
	}
}
