package sysbox

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultCacheDir holds the cached root file systems and the containers'
// directories.
const DefaultCacheDir = "/var/cache/pve-inspect-testbed"

// DefaultSuite is the Debian release the root is built from.
const DefaultSuite = "bookworm"

// fallbackMirror is used when the machine's apt sources name no Debian mirror.
const fallbackMirror = "http://deb.debian.org/debian"

// recipeVersion changes whenever the post-build steps change, so that cached
// roots built by an older recipe are not reused.
const recipeVersion = "sysbox-rootfs/1"

// BasePackages returns the packages every root gets on top of minbase.
func BasePackages() []string { return []string{"systemd", "systemd-sysv", "dbus"} }

// RootfsOptions describe the cached root file system.
type RootfsOptions struct {
	// CacheDir is where roots are cached; DefaultCacheDir when empty.
	CacheDir string
	// Suite is the Debian release; DefaultSuite when empty.
	Suite string
	// Mirror is the Debian archive URL; read from the machine's apt sources
	// when empty. It is not part of the recipe hash.
	Mirror string
	// Packages are installed on top of BasePackages (debootstrap --include).
	Packages []string

	// debootstrap replaces the debootstrap run in tests of the cache.
	debootstrap func(ctx context.Context, args []string) ([]byte, error)
}

func (o RootfsOptions) withDefaults() RootfsOptions {
	if o.CacheDir == "" {
		o.CacheDir = DefaultCacheDir
	}
	if o.Suite == "" {
		o.Suite = DefaultSuite
	}
	return o
}

// packages returns the sorted, de-duplicated --include list.
func (o RootfsOptions) packages() []string {
	p := append(BasePackages(), o.Packages...)
	slices.Sort(p)
	return slices.Compact(p)
}

// Recipe returns the text whose hash names the cached root: everything that
// decides the root's content.
func (o RootfsOptions) Recipe() string {
	o = o.withDefaults()
	return fmt.Sprintf("%s\nsuite=%s\nvariant=minbase\ninclude=%s\n",
		recipeVersion, o.Suite, strings.Join(o.packages(), ","))
}

// RootfsPath returns where the root for these options is (or would be) cached.
func (o RootfsOptions) RootfsPath() string {
	o = o.withDefaults()
	sum := sha256.Sum256([]byte(o.Recipe()))
	return filepath.Join(o.CacheDir, "rootfs-"+hex.EncodeToString(sum[:])[:16])
}

// EnsureRootfs returns the path of the cached root for o, building it first
// when it is missing. Concurrent callers (other test processes) wait for one
// build. The returned directory must be treated as read only.
func EnsureRootfs(ctx context.Context, o RootfsOptions) (string, error) {
	o = o.withDefaults()
	for _, p := range o.Packages {
		if p == "" || strings.ContainsAny(p, ", \t\n") {
			return "", fmt.Errorf("rootfs: bad package name %q", p)
		}
	}
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return "", fmt.Errorf("rootfs: %w", err)
	}
	return cached(ctx, o.RootfsPath(), complete, func(tmp string) error {
		mirror := o.Mirror
		if mirror == "" {
			mirror = aptMirror()
		}
		return build(ctx, o, mirror, tmp)
	})
}

// cached returns dst once complete says it is, building it first when it
// is not: under an flock on dst.lock (concurrent callers, other test
// processes too, wait for one build), build makes it in a temporary
// directory beside dst that is renamed into place when build succeeds and
// removed when it fails. Temporary directories of killed builders and an
// incomplete dst are removed first.
func cached(ctx context.Context, dst string, complete func(string) bool, build func(tmp string) error) (string, error) {
	if complete(dst) {
		return dst, nil
	}
	unlock, err := lockFile(ctx, dst+".lock")
	if err != nil {
		return "", fmt.Errorf("rootfs: %w", err)
	}
	defer unlock()
	if complete(dst) { // built by another process while we waited
		return dst, nil
	}
	// We hold the lock: any temporary directory left is from a killed builder.
	stale, _ := filepath.Glob(dst + ".tmp-*")
	for _, s := range append(stale, dst) { // dst: an incomplete leftover
		if err := os.RemoveAll(s); err != nil {
			return "", fmt.Errorf("rootfs: remove stale build: %w", err)
		}
	}
	tmp := fmt.Sprintf("%s.tmp-%d", dst, os.Getpid())
	if err := build(tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return "", err
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.RemoveAll(tmp)
		return "", fmt.Errorf("rootfs: %w", err)
	}
	return dst, nil
}

// recipeFile marks a complete root; it holds the recipe.
const recipeFile = ".sysbox-recipe"

func complete(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, recipeFile))
	return err == nil
}

func build(ctx context.Context, o RootfsOptions, mirror, dir string) error {
	args := []string{"--variant=minbase", "--include=" + strings.Join(o.packages(), ","), o.Suite, dir, mirror}
	run := o.debootstrap
	if run == nil {
		run = func(ctx context.Context, args []string) ([]byte, error) {
			cmd := exec.CommandContext(ctx, "debootstrap", args...)
			cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			return cmd.CombinedOutput()
		}
	}
	out, err := run(ctx, args)
	if err != nil {
		return fmt.Errorf("rootfs: debootstrap %s: %w\n%s", strings.Join(args, " "), err, tail(out, 4000))
	}
	// Post-build steps (bump recipeVersion when changing them). The machine
	// id is left empty so every boot gets a transient one: containers from
	// one root must not share it.
	steps := []struct {
		path string
		data string
	}{
		{"etc/machine-id", ""},
		{"etc/hostname", "sysbox\n"},
	}
	for _, s := range steps {
		p := filepath.Join(dir, s.path)
		_ = os.Remove(p)
		if err := os.WriteFile(p, []byte(s.data), 0o644); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, recipeFile), []byte(o.Recipe()), 0o644); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	return nil
}

// aptMirror returns the first Debian archive URL in the machine's apt
// sources (deb822 or one-line format), or fallbackMirror.
func aptMirror() string {
	var files []string
	files, _ = filepath.Glob("/etc/apt/sources.list.d/*.sources")
	files = append(files, "/etc/apt/sources.list")
	for _, f := range files {
		if m := mirrorIn(f); m != "" {
			return m
		}
	}
	return fallbackMirror
}

// mirrorIn returns the first URL in file that serves the main Debian
// archive (not security, not a third-party repository).
func mirrorIn(file string) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		var urls []string
		switch {
		case strings.HasPrefix(line, "URIs:"):
			urls = strings.Fields(strings.TrimPrefix(line, "URIs:"))
		case strings.HasPrefix(line, "deb "):
			for _, w := range strings.Fields(line)[1:] {
				if strings.Contains(w, "://") {
					urls = append(urls, w)
					break
				}
			}
		}
		for _, u := range urls {
			if strings.HasSuffix(strings.TrimRight(u, "/"), "/debian") {
				return strings.TrimRight(u, "/")
			}
		}
	}
	return ""
}

// lockFile takes an exclusive flock on path, waiting until ctx ends. The
// returned function releases it.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
