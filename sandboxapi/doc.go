// Package sandboxapi serves the local sandbox API of DESIGN.md section 5
// over HTTP: routes, authentication, decoding and validation, the mapping
// of the engine's errors to problem documents, streaming and the OpenAPI
// document. The sandboxes themselves are the engine's (package sandbox);
// the wire types are sandboxapi/apitype.
//
// Where things are:
//
//	server.go     Options, Server, authentication, the request wrapper
//	listen.go     the unix socket, TLS with reload, graceful serve
//	handlers.go   the route table and the handlers
//	egress.go     the egress handlers
//	decode.go     strict JSON decoding and request validation
//	dhcpranges.go a network's dhcp_ranges: each range, and room for its NICs
//	problem.go    problem titles and HTTP statuses; asProblem, the one error mapping
//	readstream.go downloads: size checked before the first byte, then streamed
//	openapi.go    the OpenAPI document, built from the route table
//	metrics.go    the request metrics
//
// Design decisions:
//
//   - The package owns the HTTP surface and nothing else, like tailscale's
//     localapi over ipnlocal: every sandbox operation is a call on the
//     *sandbox.Engine it is built over, and asProblem is the only place an
//     error becomes an HTTP status (the engine returns sentinels and typed
//     errors, the handlers' own refusals are problems already).
//   - Reads from a guest are checked against the cap before the first
//     response byte, so "over the cap" is a distinct error (output-limit)
//     and never a truncated 200: the guest agent client learns the size from
//     the open handle and the bytes stream with it as Content-Length; a Guest
//     that cannot tell the size first is spooled to a temporary file.
//   - Errors are RFC 9457 problem documents whose "type" is a stable short
//     slug (apitype.ProblemNotFound, ...); clients branch on it.
package sandboxapi
