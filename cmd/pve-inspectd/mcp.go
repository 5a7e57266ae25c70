package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

// newMCPCmd is `pve-inspectd mcp`: the MCP tools on stdin/stdout, for an
// agent on the node or one that runs `ssh node pve-inspectd mcp`. It calls
// the running daemon's API (unix socket, or --addr with a token); it holds
// no sandbox logic of its own.
func newMCPCmd(g *globals) *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "serve the sandbox tools over MCP on stdin/stdout (configure with [mcp])",
		Long: "Serves the Model Context Protocol on stdin/stdout for a coding agent: tools to create, list, use and destroy\n" +
			"sandboxes. It calls the daemon's sandbox API over its unix socket (or --addr with $PVE_INSPECT_TOKEN);\n" +
			"logs go to stderr. Claude Code: claude mcp add pve -- ssh root@NODE pve-inspectd mcp",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			log := g.logger()
			o, err := cfg.MCP.ServerOptions(version, log)
			if err != nil {
				return err
			}
			c, err := af.client(g)
			if err != nil {
				return err
			}
			if _, err := c.Health(cmd.Context()); err != nil {
				return fmt.Errorf("mcp: the sandbox API does not answer (is pve-inspectd running with [api] enabled?): %w", err)
			}
			// Over the socket the caller is admin; over --addr the API
			// enforces the token's scopes on every call.
			srv := mcpserver.New(c, o, apitype.ScopeAdmin)
			err = srv.Run(cmd.Context(), &mcp.IOTransport{Reader: io.NopCloser(cmd.InOrStdin()), Writer: nopWriteCloser{cmd.OutOrStdout()},
				MaxLineLength: int(max(mcpserver.MaxMessageBytes(o), mcp.DefaultMaxLineLength))})
			if errors.Is(err, mcp.ErrConnectionClosed) || cmd.Context().Err() != nil {
				return nil
			}
			return err
		},
	}
	af.register(cmd)
	return cmd
}

// nopWriteCloser leaves stdout open when the MCP session ends.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
