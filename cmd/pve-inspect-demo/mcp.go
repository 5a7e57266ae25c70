package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// mcpRoundTrip starts `pve-inspectd mcp` (stdio) on the node as an agent
// would, lists its tools and runs one command in the sandbox through it.
func mcpRoundTrip(ctx context.Context, w io.Writer, bed *testvm.Bed, inspectd, cfgPath, id string) error {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", bed.NodeNS(), inspectd, "-c", cfgPath, "mcp")
	c := mcp.NewClient(&mcp.Implementation{Name: "pve-inspect-demo", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return fmt.Errorf("mcp: connect to pve-inspectd mcp: %w", err)
	}
	defer cs.Close()
	l, err := cs.ListTools(ctx, nil)
	if err != nil {
		return fmt.Errorf("mcp: list tools: %w", err)
	}
	names := make([]string, len(l.Tools))
	for i, t := range l.Tools {
		names[i] = t.Name
	}
	fmt.Fprintf(w, "pve-inspectd mcp (stdio): %d tools: %s\n", len(names), strings.Join(names, " "))
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpserver.ToolExec, Arguments: map[string]any{"id": id, "command": "echo hello from $(hostname) over MCP"}})
	if err != nil {
		return fmt.Errorf("mcp: call %s: %w", mcpserver.ToolExec, err)
	}
	if res.IsError {
		return fmt.Errorf("mcp: %s: tool error %v", mcpserver.ToolExec, res.Content)
	}
	out, _ := res.StructuredContent.(map[string]any)
	fmt.Fprintf(w, "tools/call %s -> exit %v: %v", mcpserver.ToolExec, out["exit_code"], out["stdout"])
	return nil
}
