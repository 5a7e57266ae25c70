package mcpserver_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

// bearer adds a token to every request.
type bearer struct {
	tok string
	rt  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.tok)
	return b.rt.RoundTrip(r)
}

func TestHTTPTokensAndScopes(t *testing.T) {
	b := newBed(t, bedOpts{})
	h := mcpserver.HTTPHandler(tokens{"r": {"read"}, "x": {"exec"}, "a": {"admin"}},
		func(tok string) mcpserver.API { return client.NewInProcess(b.srv.Handler(), client.WithToken(tok)) },
		mcpserver.Options{DefaultTemplate: "debian"})
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)

	session := func(tok string) *mcp.ClientSession {
		return b.connect(b.ctx(), &mcp.StreamableClientTransport{Endpoint: hs.URL, HTTPClient: &http.Client{Transport: bearer{tok, http.DefaultTransport}}})
	}

	admin := session("a")
	sb := ok[sandboxapi.Sandbox](t, "create", callOn(t, b.ctx(), admin, mcpserver.ToolCreate, nil))
	if sb.Owner != "tok-a" {
		t.Errorf("owner %q: the API did not see the caller's token", sb.Owner)
	}
	o := ok[mcpserver.ExecOutput](t, "exec", callOn(t, b.ctx(), admin, mcpserver.ToolExec, map[string]any{"id": sb.ID, "argv": []string{"uname", "-a"}}))
	if !strings.HasPrefix(o.Stdout, "Linux") {
		t.Errorf("exec over HTTP: %+v", o)
	}
	// progress over HTTP
	params := &mcp.CallToolParams{Name: mcpserver.ToolExec, Arguments: map[string]any{"id": sb.ID, "argv": []string{"stream", "3"}}}
	params.SetProgressToken(7)
	res, err := admin.CallTool(b.ctx(), params)
	if err != nil {
		t.Fatal(err)
	}
	if o := ok[mcpserver.ExecOutput](t, "exec", res); o.Stdout != "out 0\nout 2\n" {
		t.Errorf("streamed over HTTP: %+v", o)
	}

	read := session("r")
	l, err := read.ListTools(b.ctx(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range l.Tools {
		if tl.Name != mcpserver.ToolList && tl.Name != mcpserver.ToolGet {
			t.Errorf("read-only token sees %s", tl.Name)
		}
	}
	if l := ok[mcpserver.SandboxList](t, "list", callOn(t, b.ctx(), read, mcpserver.ToolList, nil)); len(l.Sandboxes) != 1 {
		t.Errorf("read token list: %+v", l)
	}
	res, err = read.CallTool(b.ctx(), &mcp.CallToolParams{Name: mcpserver.ToolCreate, Arguments: map[string]any{}})
	if err == nil && !res.IsError {
		t.Fatal("read-only token created a sandbox")
	}
	if l := ok[mcpserver.SandboxList](t, "list", callOn(t, b.ctx(), admin, mcpserver.ToolList, nil)); len(l.Sandboxes) != 1 {
		t.Errorf("after refused create: %d sandboxes", len(l.Sandboxes))
	}

	exec := session("x")
	if p := problem(t, "destroy", callOnAllowErr(t, exec, mcpserver.ToolDestroy, map[string]any{"id": sb.ID})); !strings.Contains(p.Detail, "unknown tool") && p.Type != "sdk" {
		t.Errorf("exec token destroy: %+v", p)
	}

	for _, tc := range []struct {
		name, auth string
	}{{"no token", ""}, {"unknown token", "Bearer nope"}, {"not bearer", "Basic YTph"}} {
		req, _ := http.NewRequest("POST", hs.URL, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: status %d", tc.name, resp.StatusCode)
		}
	}
}

// callOnAllowErr turns a protocol error into a tool-error-like result, for
// calls whose refusal may come from the SDK (an unknown tool).
func callOnAllowErr(t *testing.T, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
	}
	return res
}
