package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

// TestMCPStdio drives `pve-inspectd mcp` over its stdin/stdout with the Go
// SDK's client: it reaches the API over the socket, and ends when stdin
// closes.
func TestMCPStdio(t *testing.T) {
	sock := startAPI(t, true)
	cfg := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfg, []byte("[node]\nid = \"n1\"\n[mcp]\ndefault_template = \"debian\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	root := newRootCmd()
	root.SetIn(inR)
	root.SetOut(outW)
	root.SetErr(io.Discard)
	root.SetArgs([]string{"-c", cfg, "mcp", "--socket", sock})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(context.Background()); outW.Close() }()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := cs.ListTools(ctx, nil)
	if err != nil || len(l.Tools) != 12 {
		t.Fatalf("tools: %d %v", len(l.Tools), err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpserver.ToolCreate, Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("create: %v %+v", err, res)
	}
	id := res.StructuredContent.(map[string]any)["id"].(string)
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpserver.ToolExec, Arguments: map[string]any{"id": id, "argv": []string{"uname", "-a"}}})
	if err != nil || res.IsError || !strings.HasPrefix(res.StructuredContent.(map[string]any)["stdout"].(string), "Linux") {
		t.Fatalf("exec: %v %+v", err, res)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpserver.ToolDestroy, Arguments: map[string]any{"id": id}})
	if err != nil || res.IsError {
		t.Fatalf("destroy: %v %+v", err, res)
	}
	_ = cs.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("pve-inspectd mcp ended with %v", err)
		}
	case <-ctx.Done():
		t.Fatal("pve-inspectd mcp did not end when its stdin closed")
	}
}

func TestMCPNoDaemon(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfg, []byte("[node]\nid = \"n1\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := run(t, "", "-c", cfg, "mcp", "--socket", filepath.Join(t.TempDir(), "none.sock"))
	if err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Fatalf("err %v, want the API not answering", err)
	}
}
