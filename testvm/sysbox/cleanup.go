package sysbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupParent is the cgroup (below the cgroup2 mount) that holds one child
// cgroup per container.
const cgroupParent = "pve-inspect-sysbox"

// cgroup2Mount returns where the host's cgroup2 hierarchy is mounted: the
// unified layout (/sys/fs/cgroup) or the hybrid one (/sys/fs/cgroup/unified).
func cgroup2Mount() (string, error) {
	for _, p := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p, nil
		}
	}
	return "", errors.New("sysbox: no cgroup2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified")
}

// killCgroup kills every process in the cgroup at path and below
// (cgroup.kill), waits until they are gone and removes the child cgroups,
// and path itself when removeSelf is set. A missing cgroup is not an error.
// The container's cgroup must not be booted into again after it: a process
// cloned into a cgroup shortly after cgroup.kill was seen to be killed too.
func killCgroup(path string, removeSelf bool) error {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := os.WriteFile(filepath.Join(path, "cgroup.kill"), []byte("1"), 0); err != nil {
		return fmt.Errorf("sysbox: kill cgroup %s: %w", path, err)
	}
	return removeCgroups(path, removeSelf)
}

// removeCgroups removes the cgroups below path, and path itself when
// removeSelf is set.
func removeCgroups(path string, removeSelf bool) error {
	var dirs []string
	_ = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && (p != path || removeSelf) {
			dirs = append(dirs, p)
		}
		return nil
	})
	// Deepest first. A cgroup whose processes were just killed stays busy
	// until they are reaped; retry for a while.
	deadline := time.Now().Add(30 * time.Second)
	for i := len(dirs) - 1; i >= 0; i-- {
		for {
			err := unix.Rmdir(dirs[i])
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("sysbox: remove cgroup %s: %w", dirs[i], err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// createLock creates and locks base/<name>.lock atomically: the file is
// locked under a temporary name and renamed, so Sweep never sees an
// unlocked lock file of a live container.
func createLock(base, name string) (*os.File, error) {
	tmp := filepath.Join(base, "."+name+".lock-new")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("sysbox: lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("sysbox: lock: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(base, name+".lock")); err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("sysbox: lock: %w", err)
	}
	return f, nil
}

// Sweep removes the containers under cacheDir (DefaultCacheDir when empty)
// whose owner is gone: their lock file is not locked any more because the
// test process that started them died without Close. For each it kills the
// processes in the container's own cgroup, removes that cgroup and the
// container's directory. Start calls it; containers of live runs are left
// alone.
func Sweep(cacheDir string) error {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir
	}
	base := filepath.Join(cacheDir, "containers")
	locks, _ := filepath.Glob(filepath.Join(base, "sbx-*.lock"))
	cg2, err := cgroup2Mount()
	if err != nil {
		return err
	}
	var errs []error
	for _, l := range locks {
		if err := sweepOne(cg2, l); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func sweepOne(cg2, lockPath string) error {
	f, err := os.OpenFile(lockPath, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // swept by someone else
		}
		return fmt.Errorf("sysbox: sweep: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return nil // owner alive (or another sweeper at work)
	}
	if _, err := os.Stat(lockPath); err != nil {
		return nil // removed between open and lock: already swept
	}
	name := strings.TrimSuffix(filepath.Base(lockPath), ".lock")
	dir := filepath.Join(filepath.Dir(lockPath), name)
	// The container's cgroup is named after it; never trust a path from the
	// directory, so a sweep can only ever kill a sysbox container's cgroup.
	if err := killCgroup(filepath.Join(cg2, cgroupParent, name), true); err != nil {
		return fmt.Errorf("sysbox: sweep %s: %w", name, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("sysbox: sweep %s: %w", name, err)
	}
	if err := os.Remove(lockPath); err != nil {
		return fmt.Errorf("sysbox: sweep %s: %w", name, err)
	}
	return nil
}
