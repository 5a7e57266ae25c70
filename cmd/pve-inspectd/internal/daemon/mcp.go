package daemon

import (
	"log/slog"
	"net/http"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

// MCPPath is where the MCP server answers on the API's TCP listener.
const MCPPath = "/v1/mcp"

// TCPHandler is the handler of the API's TCP listener: the sandbox API,
// and with [mcp] http the MCP server at MCPPath behind the same tokens.
// The MCP tools reach the API in process with the caller's token, so the
// API applies its scopes to them as to any TCP caller.
func TCPHandler(srv *sandboxapi.Server, a config.APISection, m config.MCPSection, version string, log *slog.Logger) (http.Handler, error) {
	api := srv.Handler()
	if !m.HTTP {
		return api, nil
	}
	o, err := m.ServerOptions(version, log)
	if err != nil {
		return nil, err
	}
	if len(o.Env) > 0 && len(o.EnvTokens)+len(o.EnvOwners) == 0 {
		log.Info("mcp over http: [mcp] env_file goes to no token; name them in env_file_tokens or env_file_owners")
	}
	mux := http.NewServeMux()
	mux.Handle(MCPPath, mcpserver.HTTPHandler(auth.Open(a.TokenFile),
		func(tok string) mcpserver.API { return client.NewInProcess(api, client.WithToken(tok)) }, o))
	mux.Handle("/", api)
	return mux, nil
}

// tcpHandler is TCPHandler for the running API; an [mcp] it cannot use
// (an unreadable env_file) is logged and the API is served without MCP, as
// the API never ends the daemon.
func (a *API) tcpHandler(srv *sandboxapi.Server) http.Handler {
	h, err := TCPHandler(srv, a.cfg.API, a.cfg.MCP, "", a.log)
	if err != nil {
		a.log.Error("mcp over http disabled", "err", err)
		return srv.Handler()
	}
	return h
}
