// Package apitype holds the sandbox API's wire types: the JSON documents
// of requests and answers (types.go, egress.go), the RFC 9457 problem
// document with its stable "type" slugs (problem.go), the bearer-token
// scopes (scope.go) and the rules of a create's secrets (env.go).
//
// Design decisions:
//
//   - It imports nothing of this module (testvm/layout_test.go enforces
//     it), like tailscale's ipn next to ipnlocal: the engine (sandbox), the
//     HTTP layer (sandboxapi), the Go client (sandboxapi/client) and the
//     MCP face (sandboxapi/mcpserver) all speak these types, and a client
//     never links the server.
//   - A Problem's Type is the stable contract clients branch on; Title and
//     Status are filled by the HTTP layer (sandboxapi/problem.go), the only
//     place that knows HTTP status codes.
//   - What is on disk is not here: the engine's state file has its own
//     versioned types (sandbox/statefile.go), so these may change without
//     changing the file.
package apitype
