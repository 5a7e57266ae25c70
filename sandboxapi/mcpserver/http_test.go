package mcpserver_test

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

func TestHTTPTokensAndScopes(t *testing.T) {
	b := newBed(t, bedOpts{})
	rec := &recorder{modes: map[string]uint32{}}
	h := mcpserver.HTTPHandler(tokens{"r": {"read"}, "x": {"exec"}, "a": {"admin"}},
		func(tok string) mcpserver.API {
			return &recorder{API: client.NewInProcess(b.srv.Handler(), client.WithToken(tok)), modes: rec.modes, execErrs: nil, shared: rec}
		},
		mcpserver.Options{DefaultTemplate: "debian"})
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)

	session := func(tok string) *mcp.ClientSession {
		return b.connect(b.ctx(), &mcp.StreamableClientTransport{Endpoint: hs.URL, HTTPClient: &http.Client{Transport: testkit.Bearer{Token: tok}}})
	}

	admin := session("a")
	sb := ok[apitype.Sandbox](t, "create", callOn(t, b.ctx(), admin, mcpserver.ToolCreate, nil))
	if sb.Owner != "tok-a" {
		t.Errorf("owner %q: the API did not see the caller's token", sb.Owner)
	}
	o := ok[mcpserver.ExecOutput](t, "exec", callOn(t, b.ctx(), admin, mcpserver.ToolExec, map[string]any{"id": sb.ID, "argv": []string{"uname", "-a"}}))
	if !strings.HasPrefix(o.Stdout, "Linux") {
		t.Errorf("exec over HTTP: %+v", o)
	}
	// A write near the cap fits in one HTTP request (over the SDK's 4 MiB
	// default body limit once base64-encoded).
	big := strings.Repeat("0123456789abcdef", 6<<20/16)
	w := ok[mcpserver.FileWritten](t, "write", callOn(t, b.ctx(), admin, mcpserver.ToolWriteFile, map[string]any{"id": sb.ID, "path": "/root/big",
		"content": base64.StdEncoding.EncodeToString([]byte(big)), "encoding": "base64"}))
	if w.Size != int64(len(big)) {
		t.Errorf("wrote %d of %d bytes", w.Size, len(big))
	}
	if r := ok[mcpserver.FileContent](t, "read", callOn(t, b.ctx(), admin, mcpserver.ToolReadFile, map[string]any{"id": sb.ID, "path": "/root/big"})); r.Content != big {
		t.Errorf("read back %d bytes", len(r.Content))
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

	// Cancelling a call over HTTP cancels the API request that runs it.
	ctx, cancel := context.WithCancel(b.ctx())
	params = &mcp.CallToolParams{Name: mcpserver.ToolExec, Arguments: map[string]any{"id": sb.ID, "argv": []string{"sleep"}, "timeout_seconds": 300}}
	params.SetProgressToken("c")
	n0, _ := rec.execs()
	s0 := rec.startedExecs()
	done := make(chan error, 1)
	go func() { _, err := admin.CallTool(ctx, params); done <- err }()
	rec.waitExecStarted(t, s0)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call: %v", err)
	}
	waitCancelled(t, rec, n0)

	read := session("r")
	l, err := read.ListTools(b.ctx(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range l.Tools {
		if tl.Name != mcpserver.ToolList && tl.Name != mcpserver.ToolGet && tl.Name != mcpserver.ToolEgressLog {
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

	// A session opened by one token is not usable with another.
	sid := rawInit(t, hs.URL, "a")
	for _, tc := range []struct {
		tok  string
		want int
	}{{"r", http.StatusNotFound}, {"x", http.StatusNotFound}, {"a", http.StatusOK}} {
		if st := rawPost(t, hs.URL, tc.tok, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); st != tc.want {
			t.Errorf("session of a used with %s: status %d, want %d", tc.tok, st, tc.want)
		}
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

// rawInit opens a session with a raw initialize and returns its id.
func rawInit(t *testing.T, url, tok string) string {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		t.Fatalf("initialize: status %d, session %q", resp.StatusCode, sid)
	}
	if st := rawPost(t, url, tok, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); st != http.StatusAccepted {
		t.Fatalf("initialized: status %d", st)
	}
	return sid
}

func rawPost(t *testing.T, url, tok, sid, body string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
