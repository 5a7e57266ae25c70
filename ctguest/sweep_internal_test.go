package ctguest

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestSweepReportsRunningExecs: an exec cgroup a running call of this
// client holds is left in place and makes Sweep ErrExecsRemain (the
// delete then waits before it frees the container's id); with none held
// and none left, Sweep is nil.
func TestSweepReportsRunningExecs(t *testing.T) {
	dir := t.TempDir()
	c := New(Options{CgroupDir: func(int) string { return dir }})
	if err := c.Sweep(100); err != nil {
		t.Fatalf("sweep of an empty cgroup: %v", err)
	}
	running := filepath.Join(dir, execPrefix+"running")
	if err := os.Mkdir(running, 0o755); err != nil {
		t.Fatal(err)
	}
	c.track(running, true)
	if err := c.Sweep(100); !errors.Is(err, ErrExecsRemain) {
		t.Fatalf("sweep with a running call's cgroup: %v, want ErrExecsRemain", err)
	}
	if _, err := os.Stat(running); err != nil {
		t.Fatalf("the running call's cgroup was touched: %v", err)
	}
	c.track(running, false)
	if err := os.Remove(running); err != nil { // its call removes it as it ends
		t.Fatal(err)
	}
	if err := c.Sweep(100); err != nil {
		t.Fatalf("sweep once the call ended: %v", err)
	}
}
