// Package mcpserver is the Model Context Protocol face of the sandbox API:
// coding agents (Claude Code, Codex, Gemini) create, use and destroy
// sandboxes through MCP tools. It is built on the official Go SDK
// (github.com/modelcontextprotocol/go-sdk) and serves two transports:
// stdio (`pve-inspectd mcp`, talking to the daemon's unix socket) and
// streamable HTTP at /v1/mcp on the API's TCP listener.
//
// Design decisions:
//
//   - A thin face. Every tool calls the sandbox API through the API
//     interface (the sandboxapi/client.Client: over the unix socket, or in
//     process with the caller's bearer token), never Proxmox or a guest
//     agent directly; the API's guard, caps, reaper and owner rules apply
//     unchanged.
//   - Errors the agent can act on (unknown sandbox, cap refused, file over
//     the cap, bad arguments) are tool results with isError set whose text
//     is the API's problem document as JSON (type, title, detail, and the
//     cap or field when known), never JSON-RPC protocol failures.
//   - Tools follow the caller's scopes: a read-only token lists only the
//     read tools (list, get, egress_log); exec adds the guest tools; admin adds create,
//     extend and destroy. The API checks the same scopes again.
//   - Over HTTP every request is authenticated, and a session is bound to
//     the token that opened it (its tools, its scopes, the token its API
//     calls carry): a session id presented with another token is refused,
//     so it can never carry one token's rights to another.
//   - Long commands: when the client sends a progress token, the command's
//     output streams from the API and each chunk becomes a progress
//     notification; cancelling the call cancels the API request, and the
//     API kills the command's process group in the guest.
package mcpserver
