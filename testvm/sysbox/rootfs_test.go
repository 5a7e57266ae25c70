package sysbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// fakeDebootstrap makes a root with the files the post-build steps expect
// and counts its runs.
func fakeDebootstrap(runs *atomic.Int32, fail bool) func(context.Context, []string) ([]byte, error) {
	return func(_ context.Context, args []string) ([]byte, error) {
		runs.Add(1)
		dir := args[len(args)-2]
		if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
			return nil, err
		}
		if fail {
			return []byte("E: Couldn't download packages"), errors.New("exit status 1")
		}
		return nil, os.WriteFile(filepath.Join(dir, "etc", "os-release"), []byte("fake\n"), 0o644)
	}
}

func TestEnsureRootfsCache(t *testing.T) {
	cache := t.TempDir()
	var runs atomic.Int32
	o := RootfsOptions{CacheDir: cache, Mirror: "http://mirror.invalid/debian", debootstrap: fakeDebootstrap(&runs, false)}
	ctx := context.Background()

	// Concurrent callers: one build, one path.
	var wg sync.WaitGroup
	paths := make([]string, 4)
	errs := make([]error, 4)
	for i := range paths {
		wg.Go(func() { paths[i], errs[i] = EnsureRootfs(ctx, o) })
	}
	wg.Wait()
	for i := range paths {
		if errs[i] != nil || paths[i] != o.RootfsPath() {
			t.Fatalf("caller %d: %q, %v; want %q", i, paths[i], errs[i], o.RootfsPath())
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("%d builds for concurrent callers, want 1", n)
	}
	b, err := os.ReadFile(filepath.Join(o.RootfsPath(), recipeFile))
	if err != nil || string(b) != o.Recipe() {
		t.Errorf("recipe file %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(o.RootfsPath(), "etc", "machine-id")); err != nil || len(b) != 0 {
		t.Errorf("machine-id %q, %v; want empty", b, err)
	}

	// Cached: no new build.
	if _, err := EnsureRootfs(ctx, o); err != nil || runs.Load() != 1 {
		t.Errorf("second call: %v, %d builds", err, runs.Load())
	}

	// A changed recipe builds a new root beside the old one.
	o2 := o
	o2.Packages = []string{"iproute2"}
	p2, err := EnsureRootfs(ctx, o2)
	if err != nil || p2 == o.RootfsPath() || runs.Load() != 2 {
		t.Errorf("changed recipe: %q, %v, %d builds", p2, err, runs.Load())
	}

	// A build killed half-way (tmp dir left) and a root without its recipe
	// file (incomplete) are rebuilt, and the leftovers removed.
	o3 := o
	o3.Packages = []string{"procps"}
	stale := o3.RootfsPath() + ".tmp-99999"
	for _, d := range []string{stale, o3.RootfsPath()} {
		if err := os.MkdirAll(filepath.Join(d, "junk"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := EnsureRootfs(ctx, o3); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale build dir left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(o3.RootfsPath(), "junk")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("incomplete root reused: %v", err)
	}
}

func TestEnsureRootfsFailure(t *testing.T) {
	cache := t.TempDir()
	var runs atomic.Int32
	o := RootfsOptions{CacheDir: cache, Mirror: "http://mirror.invalid/debian", debootstrap: fakeDebootstrap(&runs, true)}
	if _, err := EnsureRootfs(context.Background(), o); err == nil {
		t.Fatal("failed build reported success")
	}
	left, _ := filepath.Glob(filepath.Join(cache, "rootfs-*"))
	for _, l := range left {
		if filepath.Ext(l) != ".lock" {
			t.Errorf("failed build left %s", l)
		}
	}
	if _, err := EnsureRootfs(context.Background(), RootfsOptions{CacheDir: cache, Packages: []string{"a,b"}}); err == nil {
		t.Error("bad package name accepted")
	}
}
