package testkit

import (
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run under CI (CI set to anything but ""),
// where a missing prerequisite is a failure, never a skip.
func InCI() bool { return os.Getenv("CI") != "" }

// RequireRoot is the module's one rule for tests that need root: without
// root it skips loudly when CI is unset and fails when CI is set. Each tool
// named must be on PATH (a missing tool fails the test: the project's
// install step provides every tool its tests use).
func RequireRoot(tb testing.TB, tools ...string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		if InCI() {
			tb.Fatalf("%s needs root (CI is set, so this is a failure)", tb.Name())
		}
		tb.Skipf("SKIPPING %s: needs root (network namespaces, nftables, the test bed); run as root or with CI=true to make this a failure", tb.Name())
	}
	RequireTools(tb, tools...)
}

// RequireTools fails the test when a named tool is not on PATH.
func RequireTools(tb testing.TB, tools ...string) {
	tb.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Fatalf("%s needs %s on PATH (make deps installs it): %v", tb.Name(), tool, err)
		}
	}
}
