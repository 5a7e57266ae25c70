package ctguest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// execPrefix starts the name of every exec cgroup the client makes in a
// container's cgroup directory.
const execPrefix = "pve-inspect-exec-"

// execCgroup is the cgroup v2 directory one exec runs in: a child of the
// container's cgroup directory, beside the container's delegated inner
// cgroup (doc.go). Every process of the exec, lxc-attach's own included,
// is started into it and stays in it.
type execCgroup struct {
	dir string
	fd  *os.File // the directory, for CLONE_INTO_CGROUP
}

// checkContainerDir refuses a container cgroup directory the container's
// root could write: its cgroup.procs must be host root's and writable by
// no one else (cgroup v2 moves a process only for a writer of the
// cgroup.procs of the common ancestor of its source and target, and the
// container's directory is the exec cgroup's parent), and the delegated
// inner cgroup must be there (the container runs below it, not in dir).
func checkContainerDir(dir, inner string) error {
	st, err := os.Stat(filepath.Join(dir, "cgroup.procs"))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: no cgroup %s: the container does not run", sandbox.ErrGuestUnavailable, dir)
	}
	if err != nil {
		return fmt.Errorf("container cgroup: %w", err)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || sys.Uid != 0 || st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("container cgroup %s: cgroup.procs is not host root's alone (mode %v): the container could move an exec's processes out of its cgroup", dir, st.Mode().Perm())
	}
	if inner == "" {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, inner, "cgroup.procs")); err != nil {
		return fmt.Errorf("%w: container cgroup %s has no inner cgroup %q (lxc.cgroup.dir.container.inner): %w", sandbox.ErrGuestUnavailable, dir, inner, err)
	}
	return nil
}

// newExecName returns the path of a fresh exec cgroup under the
// container's cgroup directory dir (random, so no two calls share one).
func newExecName(dir string) (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return filepath.Join(dir, execPrefix+hex.EncodeToString(b[:])), nil
}

// newExecCgroup makes the exec cgroup p (newExecName) and opens it.
func newExecCgroup(p string) (*execCgroup, error) {
	if err := os.Mkdir(p, 0o755); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: exec cgroup: %w", sandbox.ErrGuestUnavailable, err)
		}
		return nil, fmt.Errorf("exec cgroup: %w", err)
	}
	fd, err := os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		_ = os.Remove(p)
		return nil, fmt.Errorf("exec cgroup: %w", err)
	}
	return &execCgroup{dir: p, fd: fd}, nil
}

// kill SIGKILLs every process in the cgroup, and every process forked
// into it while the kill runs (cgroup.kill, Linux 5.14).
func (c *execCgroup) kill() error { return killCgroup(c.dir) }

// killCgroup SIGKILLs what runs in cgroup dir; a missing dir is no error.
func killCgroup(dir string) error {
	err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("exec cgroup: kill: %w", err)
	}
	return nil
}

// populated reports whether a live process is in the cgroup (its
// cgroup.events, which the kernel writes; a zombie does not count).
func populated(dir string) (bool, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, l := range bytes.Split(data, []byte("\n")) {
		if v, ok := bytes.CutPrefix(l, []byte("populated ")); ok {
			return string(v) != "0", nil
		}
	}
	return false, fmt.Errorf("%s/cgroup.events has no populated line", dir)
}

// waitEmpty polls until no live process is left in the cgroup dir, for at
// most grace.
func waitEmpty(dir string, grace time.Duration) error {
	deadline := time.Now().Add(grace)
	delay := time.Millisecond
	for {
		busy, err := populated(dir)
		if err != nil {
			return fmt.Errorf("exec cgroup: %w", err)
		}
		if !busy {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("exec cgroup %s: processes alive %v after SIGKILL", dir, grace)
		}
		time.Sleep(delay)
		delay = min(delay*2, 50*time.Millisecond)
	}
}

// remove kills what is left in the cgroup, waits for it to be gone (at
// most grace) and removes the cgroup.
func (c *execCgroup) remove(grace time.Duration) error {
	defer c.fd.Close()
	return removeCgroup(c.dir, grace)
}

func removeCgroup(dir string, grace time.Duration) error {
	if err := killCgroup(dir); err != nil {
		return err
	}
	if err := waitEmpty(dir, grace); err != nil {
		return err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("exec cgroup: %w", err)
	}
	return nil
}

// sweep removes the exec cgroups in the container cgroup dir that keep
// returns false for (killing what runs in them).
func sweep(dir string, keep func(name string) bool, grace time.Duration) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sweep exec cgroups: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), execPrefix) || keep(e.Name()) {
			continue
		}
		if err := removeCgroup(filepath.Join(dir, e.Name()), grace); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
