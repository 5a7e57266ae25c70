// Package probebuild builds the containment probe (cmd/pve-inspect-probe)
// from this module's source, for tests and the demo: static
// (CGO_ENABLED=0), stripped, into a directory of the caller's choosing.
package probebuild

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Package is the import path of the probe's main package.
const Package = "github.com/pve-inspect/pve-inspect/cmd/pve-inspect-probe"

// Build compiles the probe into dir/pve-inspect-probe and returns its
// path. It runs `go build` in the module that contains the current
// directory, so call it from inside the repository (tests do).
func Build(ctx context.Context, dir string) (string, error) {
	goBin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if os.Getenv("GOROOT") == "" {
		p, err := exec.LookPath("go")
		if err != nil {
			return "", fmt.Errorf("build probe: go not found: %w", err)
		}
		goBin = p
	}
	modOut, err := exec.CommandContext(ctx, goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("build probe: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(modOut))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("build probe: not inside the pve-inspect module")
	}
	out := filepath.Join(dir, "pve-inspect-probe")
	cmd := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", out, Package)
	cmd.Dir = filepath.Dir(gomod)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build probe: %w: %s", err, stderr.String())
	}
	return out, nil
}

// cache holds the one build per test binary.
var cache struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// ForTest builds the probe once per test binary and returns its path; it
// fails tb when the build fails. Call RemoveTestBuild from TestMain after
// m.Run to delete the build.
func ForTest(tb testing.TB) string {
	tb.Helper()
	cache.once.Do(func() {
		sweepStaleTestBuilds()
		dir := filepath.Join(os.TempDir(), testBuildPrefix+strconv.Itoa(os.Getpid()))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			cache.err = err
			return
		}
		cache.dir = dir
		cache.path, cache.err = Build(context.Background(), dir)
	})
	if cache.err != nil {
		tb.Fatalf("build the probe: %v", cache.err)
	}
	return cache.path
}

// testBuildPrefix names ForTest's build directories: prefix + owner pid.
const testBuildPrefix = "pve-inspect-probe-test-"

// sweepStaleTestBuilds removes build directories of test processes that
// are gone (a killed run cannot clean up after itself).
func sweepStaleTestBuilds() {
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), testBuildPrefix+"*"))
	for _, m := range matches {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(m), testBuildPrefix))
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); os.IsNotExist(err) {
			_ = os.RemoveAll(m)
		}
	}
}

// RemoveTestBuild deletes what ForTest built, if anything.
func RemoveTestBuild() error {
	if cache.dir == "" {
		return nil
	}
	return os.RemoveAll(cache.dir)
}
