// Package testkit is the one test kit of the module: every package's tests
// use it for the three things they all need, so each has one rule.
//
//   - RequireRoot: a test that needs root skips loudly when it is not root
//     and CI is unset, and fails when CI is set (a missing prerequisite
//     under CI=true is a failure, never a skip).
//   - NewNetNS: a throw-away named network namespace, named with a random
//     per-run part, configured with ip(8) and nft(8), and removed in
//     t.Cleanup also when the test fails; namespaces left by a killed run
//     are swept by the next. Sockets are created inside a namespace by a
//     goroutine locked to a thread that has entered it; that thread is never
//     unlocked, so it ends with the goroutine and no other code ever runs in
//     the wrong namespace.
//   - Golden: compare output with a file under testdata/, rewritten by the
//     one -update flag (go test ./... -update).
//
// Also here: small stand-ins for the services namespace tests talk to
// (a metadata service, an HTTP(S) echo, an authoritative DNS zone),
// Bearer, the HTTP client transport that presents an API token,
// StreamOpened, the one that says when an event stream was answered,
// FailureLog, a logger (a test bed's) shown only when the test failed,
// Series, the values of a registry's series that carry given labels, and
// Clock, a time source a test moves.
//
// Only tests and cmd/pve-inspect-bench import this package
// (testvm/layout_test.go enforces it).
package testkit
