package sysbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ExecError is a command inside the container that failed.
type ExecError struct {
	Argv   []string
	Output []byte
	Err    error // an *exec.ExitError when the command ran and failed
}

func (e *ExecError) Error() string {
	return fmt.Sprintf("sysbox exec %q: %v: %s", e.Argv, e.Err, bytes.TrimSpace(tail(e.Output, 2000)))
}

func (e *ExecError) Unwrap() error { return e.Err }

// Exec runs argv inside the container (its namespaces and root, a minimal
// environment with PATH) and returns its combined output. A failure is an
// *ExecError that carries the output.
func (c *Container) Exec(ctx context.Context, argv ...string) ([]byte, error) {
	return c.ExecInput(ctx, nil, argv...)
}

// ExecInput is Exec with stdin.
func (c *Container) ExecInput(ctx context.Context, stdin io.Reader, argv ...string) ([]byte, error) {
	if len(argv) == 0 {
		return nil, errors.New("sysbox exec: empty argv")
	}
	pid := c.PID()
	if pid == 0 {
		return nil, ErrNotRunning
	}
	args := append([]string{"-t", strconv.Itoa(pid), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--",
		"/usr/bin/env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0"}, argv...)
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Stdin = stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// nsenter forks into the pid namespace: on cancel, kill its child too.
	cmd.Cancel = func() error {
		killChildren(cmd.Process.Pid)
		return cmd.Process.Kill()
	}
	// A daemon the command started that kept its output open must not
	// hold Exec past the command's end (or its cancellation).
	cmd.WaitDelay = execWaitDelay
	if err := cmd.Run(); err != nil {
		return out.Bytes(), &ExecError{Argv: argv, Output: out.Bytes(), Err: err}
	}
	return out.Bytes(), nil
}

// execWaitDelay is how long Exec waits for the command's output to close
// once the command has exited or been killed.
const execWaitDelay = 10 * time.Second

// killChildren sends SIGKILL to the direct children of pid.
func killChildren(pid int) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		if ch, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(ch, syscall.SIGKILL)
		}
	}
}

// WriteFile writes data to path inside the running container (parents
// created), with mode.
func (c *Container) WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("sysbox: write %q: want an absolute path", path)
	}
	_, err := c.ExecInput(ctx, bytes.NewReader(data), "/bin/sh", "-c",
		`set -e; mkdir -p "$(dirname "$1")"; rm -f "$1"; (umask 077; cat > "$1"); chmod "$2" "$1"`,
		"sh", path, strconv.FormatUint(uint64(mode.Perm()), 8))
	return err
}

// CopyIn copies the host file hostPath to path inside the running
// container, keeping its permission bits.
func (c *Container) CopyIn(ctx context.Context, hostPath, path string) error {
	f, err := os.Open(hostPath)
	if err != nil {
		return fmt.Errorf("sysbox: copy in: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("sysbox: copy in: %w", err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("sysbox: copy in: %w", err)
	}
	return c.WriteFile(ctx, path, data, st.Mode().Perm())
}

// ReadFile returns the content of path inside the running container.
func (c *Container) ReadFile(ctx context.Context, path string) ([]byte, error) {
	var out bytes.Buffer
	pid := c.PID()
	if pid == 0 {
		return nil, ErrNotRunning
	}
	cmd := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(pid), "-m", "-r", "--", "/bin/cat", "--", path)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		if strings.Contains(stderr.String(), "No such file") {
			return nil, fmt.Errorf("sysbox: read %s: %w", path, fs.ErrNotExist)
		}
		return nil, fmt.Errorf("sysbox: read %s: %w: %s", path, err, stderr.Bytes())
	}
	return out.Bytes(), nil
}

// SystemctlShow returns the named properties of unit (`systemctl show -p`),
// or all of them when props is empty.
func (c *Container) SystemctlShow(ctx context.Context, unit string, props ...string) (map[string]string, error) {
	args := []string{"systemctl", "show", "--", unit}
	if len(props) > 0 {
		args = []string{"systemctl", "show", "-p", strings.Join(props, ","), "--", unit}
	}
	out, err := c.Exec(ctx, args...)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	for _, p := range props {
		if _, ok := m[p]; !ok {
			return nil, fmt.Errorf("sysbox: systemctl show %s: no property %s", unit, p)
		}
	}
	return m, nil
}
