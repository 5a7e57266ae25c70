package qga

import "testing"

// StartTestGuest exports the test launcher to the external test package
// (benchmarks of qgabench).
func StartTestGuest(tb testing.TB) (socket, dir string) {
	g := startGuest(tb)
	return g.Socket, g.Dir
}
