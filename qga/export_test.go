package qga

import "testing"

// StartTestGuest exports the test launcher to the external test package
// (the benchmarks in bench_test.go).
func StartTestGuest(tb testing.TB) (socket, dir string) {
	g := startGuest(tb)
	return g.Socket, g.Dir
}
