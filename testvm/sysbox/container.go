package sysbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"
)

// Options describe one container.
type Options struct {
	// Name labels the container: lower-case letters, digits and '-', at most
	// 20 characters. A random suffix is added, so parallel runs never collide.
	Name string
	// Rootfs selects the cached root (see EnsureRootfs).
	Rootfs RootfsOptions
	// Units are unit files installed in /etc/systemd/system before the
	// first boot, by unit name. (A runtime mask in /run/systemd/system does
	// not override a unit file in /etc/systemd/system.)
	Units map[string]string
	// Enable lists units enabled before the first boot (linked into
	// multi-user.target.wants), so they start at every boot.
	Enable []string
	// Files are written into the container before the first boot.
	Files []File
	// NoStandIns leaves out the stand-in pveproxy.service and
	// pvedaemon.service (see StandInUnits), which are installed and enabled
	// by default.
	NoStandIns bool
	// Binds are host directories bind-mounted into the container at every
	// boot, after the overlay root and the tmpfs /run are mounted (so a
	// target below /run, or /var/run, which the root links to it, works and
	// a target elsewhere is not copied into the overlay). For example a
	// host directory a test also hands to the Proxmox emulator, bound at
	// /var/lib/vz, so a path the emulator reports is the path a daemon in
	// the container opens.
	Binds []Bind
	// BootTimeout bounds each boot (until systemctl is-system-running
	// answers running or degraded); 2 minutes when zero.
	BootTimeout time.Duration
}

// File is a file placed into the container.
type File struct {
	// Path is absolute, inside the container.
	Path string
	// Data is the content.
	Data []byte
	// Mode is the permission bits; 0644 when zero.
	Mode fs.FileMode
}

// Bind is one bind mount of a host directory into the container.
type Bind struct {
	// Source is an existing host directory (absolute).
	Source string
	// Target is an absolute, clean path inside the container. Symlinks
	// of the cached root on the way are resolved within the root; a
	// missing target directory is created.
	Target string
	// ReadOnly makes the mount read-only.
	ReadOnly bool
}

// StandInUnits returns the stand-ins for Proxmox's API daemons: simple
// long-running services under the real unit names. Start installs them in
// /usr/lib/systemd/system, where the Proxmox packages put theirs, and
// enables them.
func StandInUnits() map[string]string {
	unit := func(what string) string {
		return "[Unit]\nDescription=Stand-in for the Proxmox VE " + what + " (sysbox)\n\n" +
			"[Service]\nExecStart=/bin/sleep infinity\n\n" +
			"[Install]\nWantedBy=multi-user.target\n"
	}
	return map[string]string{
		"pveproxy.service":  unit("API proxy"),
		"pvedaemon.service": unit("API daemon"),
	}
}

// ErrNotRunning is returned by calls that need a running container.
var ErrNotRunning = errors.New("sysbox: container not running")

// Container is a booted systemd container. Its methods are safe for
// concurrent use; Restart and Close must not race with each other.
type Container struct {
	name   string
	dir    string // CacheDir/containers/<name>
	lower  string // cached root
	cgroup string // host path of the container's cgroup
	lock   *os.File
	boot   time.Duration
	binds  string // shell lines of the boot script that mount Binds

	mu   sync.Mutex
	cmd  *exec.Cmd
	pid  int
	done chan struct{} // closed when PID 1 has exited and was reaped
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,19}$`)
var unitRE = regexp.MustCompile(`^[A-Za-z0-9:_.@\\-]+\.(service|socket|target|timer|path|mount|slice|scope)$`)

func (o Options) validate() error {
	if !nameRE.MatchString(o.Name) {
		return fmt.Errorf("sysbox: name %q: want [a-z0-9][a-z0-9-]{0,19}", o.Name)
	}
	if strings.ContainsAny(o.Rootfs.CacheDir, ",:") {
		return fmt.Errorf("sysbox: cache dir %q: ',' and ':' are not allowed (overlay options)", o.Rootfs.CacheDir)
	}
	for n := range o.Units {
		if !unitRE.MatchString(n) {
			return fmt.Errorf("sysbox: unit name %q is not a unit file name", n)
		}
	}
	for _, n := range o.Enable {
		if !unitRE.MatchString(n) {
			return fmt.Errorf("sysbox: enable %q: not a unit file name", n)
		}
	}
	for _, f := range o.Files {
		if !filepath.IsAbs(f.Path) || filepath.Clean(f.Path) != f.Path || f.Path == "/" {
			return fmt.Errorf("sysbox: file path %q: want a clean absolute path", f.Path)
		}
	}
	for _, b := range o.Binds {
		if !filepath.IsAbs(b.Source) || !filepath.IsAbs(b.Target) || filepath.Clean(b.Target) != b.Target || b.Target == "/" {
			return fmt.Errorf("sysbox: bind %q -> %q: want an absolute source and a clean absolute target", b.Source, b.Target)
		}
		if st, err := os.Stat(b.Source); err != nil || !st.IsDir() {
			return fmt.Errorf("sysbox: bind source %q: not a directory (%v)", b.Source, err)
		}
	}
	return nil
}

// Start builds or reuses the cached root, sweeps stale containers of killed
// runs, prepares a fresh overlay and boots systemd in it. It returns once
// systemd reports the system running (or degraded). On error nothing of the
// container is left behind.
func Start(ctx context.Context, o Options) (*Container, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	o.Rootfs = o.Rootfs.withDefaults()
	if o.BootTimeout == 0 {
		o.BootTimeout = 2 * time.Minute
	}
	lower, err := EnsureRootfs(ctx, o.Rootfs)
	if err != nil {
		return nil, err
	}
	if err := Sweep(o.Rootfs.CacheDir); err != nil {
		return nil, err
	}
	cg2, err := cgroup2Mount()
	if err != nil {
		return nil, err
	}
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	name := "sbx-" + o.Name + "-" + hex.EncodeToString(rnd[:])
	base := filepath.Join(o.Rootfs.CacheDir, "containers")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, fmt.Errorf("sysbox: %w", err)
	}
	lock, err := createLock(base, name)
	if err != nil {
		return nil, err
	}
	c := &Container{
		name:   name,
		dir:    filepath.Join(base, name),
		lower:  lower,
		cgroup: filepath.Join(cg2, cgroupParent, name),
		lock:   lock,
		boot:   o.BootTimeout,
	}
	if c.binds, err = c.bindScript(o.Binds); err != nil {
		c.Close()
		return nil, err
	}
	if err := c.prepare(o); err != nil {
		c.Close()
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// prepare creates the container's directories, its cgroup and the files
// that must exist before the first boot.
func (c *Container) prepare(o Options) error {
	for _, d := range []string{c.upper(), c.work(), c.root()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("sysbox: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(c.dir, "owner"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return fmt.Errorf("sysbox: %w", err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, "cgroup"), []byte(c.cgroup+"\n"), 0o644); err != nil {
		return fmt.Errorf("sysbox: %w", err)
	}
	if err := os.MkdirAll(c.cgroup, 0o755); err != nil {
		return fmt.Errorf("sysbox: create cgroup: %w", err)
	}
	// Stand-ins go where Debian packages put units, so a runtime mask in
	// /run/systemd/system overrides them as it does on Proxmox; the
	// caller's units go where an administrator puts them.
	unitPath := map[string]string{}
	enable := append([]string(nil), o.Enable...)
	if !o.NoStandIns {
		for n := range StandInUnits() {
			unitPath[n] = "/usr/lib/systemd/system/" + n
			enable = append(enable, n)
		}
	}
	for n := range o.Units {
		unitPath[n] = "/etc/systemd/system/" + n
	}
	files := []File{{Path: "/etc/hostname", Data: []byte(c.name + "\n")}}
	for n, u := range StandInUnits() {
		if !o.NoStandIns {
			files = append(files, File{Path: unitPath[n], Data: []byte(u)})
		}
	}
	for n, u := range o.Units {
		files = append(files, File{Path: unitPath[n], Data: []byte(u)})
	}
	files = append(files, o.Files...)
	for _, f := range files {
		if err := c.writeUpper(f); err != nil {
			return err
		}
	}
	for _, n := range enable {
		target, ok := unitPath[n]
		if !ok {
			target = "/usr/lib/systemd/system/" + n // a unit of the root itself
		}
		if err := c.linkUpper("/etc/systemd/system/multi-user.target.wants/"+n, target); err != nil {
			return err
		}
	}
	return nil
}

func (c *Container) upper() string { return filepath.Join(c.dir, "upper") }
func (c *Container) work() string  { return filepath.Join(c.dir, "work") }
func (c *Container) root() string  { return filepath.Join(c.dir, "root") }

// Name returns the container's unique name (also its host name).
func (c *Container) Name() string { return c.name }

// ConsoleLog returns the host path of the file that receives systemd's
// console output (all boots).
func (c *Container) ConsoleLog() string { return filepath.Join(c.dir, "console.log") }

// PID returns the host pid of the container's systemd (PID 1 inside), or 0
// when it is not running.
func (c *Container) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pid
}

// upperPath maps an absolute container path to its place in the upper
// directory, resolving symlinks of the cached root (for example /lib ->
// usr/lib) so a write never shadows one of them with a directory. Missing
// parent directories are created with the mode and owner they have below.
func (c *Container) upperPath(p string) (string, error) {
	dir, err := securejoin.SecureJoin(c.lower, filepath.Dir(p))
	if err != nil {
		return "", fmt.Errorf("sysbox: resolve %s: %w", p, err)
	}
	rel, err := filepath.Rel(c.lower, dir)
	if err != nil || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("sysbox: resolve %s: outside the root", p)
	}
	cur := c.upper()
	if rel != "." {
		for _, part := range strings.Split(rel, string(filepath.Separator)) {
			cur = filepath.Join(cur, part)
			lowerDir := filepath.Join(c.lower, strings.TrimPrefix(cur, c.upper()))
			mode, uid, gid := fs.FileMode(0o755), 0, 0
			if st, err := os.Stat(lowerDir); err == nil {
				mode = st.Mode().Perm()
				if s, ok := st.Sys().(*syscall.Stat_t); ok {
					uid, gid = int(s.Uid), int(s.Gid)
				}
			}
			if err := os.Mkdir(cur, mode); err != nil && !errors.Is(err, fs.ErrExist) {
				return "", fmt.Errorf("sysbox: %w", err)
			} else if err == nil {
				if err := os.Chown(cur, uid, gid); err != nil {
					return "", fmt.Errorf("sysbox: %w", err)
				}
			}
		}
	}
	return filepath.Join(cur, filepath.Base(p)), nil
}

func (c *Container) writeUpper(f File) error {
	dst, err := c.upperPath(f.Path)
	if err != nil {
		return err
	}
	mode := f.Mode
	if mode == 0 {
		mode = 0o644
	}
	_ = os.Remove(dst)
	if err := os.WriteFile(dst, f.Data, mode); err != nil {
		return fmt.Errorf("sysbox: write %s: %w", f.Path, err)
	}
	return os.Chmod(dst, mode)
}

func (c *Container) linkUpper(link, target string) error {
	dst, err := c.upperPath(link)
	if err != nil {
		return err
	}
	_ = os.Remove(dst)
	if err := os.Symlink(target, dst); err != nil {
		return fmt.Errorf("sysbox: link %s: %w", link, err)
	}
	return nil
}

// bindScript returns the boot script's lines that mount binds, each
// target resolved within the cached root (so /var/run/x lands in /run/x,
// never in the host's /run).
func (c *Container) bindScript(binds []Bind) (string, error) {
	q := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	var b strings.Builder
	for _, bd := range binds {
		resolved, err := securejoin.SecureJoin(c.lower, bd.Target)
		if err != nil {
			return "", fmt.Errorf("sysbox: resolve bind target %s: %w", bd.Target, err)
		}
		rel, err := filepath.Rel(c.lower, resolved)
		if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
			return "", fmt.Errorf("sysbox: bind target %s: outside the root", bd.Target)
		}
		dst := `"$SBX_ROOT"/` + q(rel)
		fmt.Fprintf(&b, "mkdir -p %s\nmount --bind %s %s\n", dst, q(bd.Source), dst)
		if bd.ReadOnly {
			fmt.Fprintf(&b, "mount -o remount,bind,ro %s\n", dst)
		}
	}
	return b.String(), nil
}

// bootScript runs as the container's PID 1 in fresh pid, mount, uts, ipc and
// net namespaces, inside the container's cgroup. It execs (never forks), so
// systemd ends up as that same PID 1.
const bootScript = `set -e
mount --make-rprivate /
mount -t overlay overlay -o "lowerdir=$SBX_LOWER,upperdir=$SBX_UPPER,workdir=$SBX_WORK" "$SBX_ROOT"
mount -t proc -o nosuid,nodev,noexec proc "$SBX_ROOT/proc"
mount -t sysfs -o nosuid,nodev,noexec sysfs "$SBX_ROOT/sys"
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$SBX_ROOT/run"
eval "$SBX_BINDS"
exec unshare --cgroup -- /bin/sh -c 'set -e
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$SBX_ROOT/sys/fs/cgroup"
exec chroot "$SBX_ROOT" /usr/bin/env -i container=other /lib/systemd/systemd --system'
`

// start boots systemd and waits until it reports the system up.
func (c *Container) start(ctx context.Context) error {
	cg, err := os.Open(c.cgroup)
	if err != nil {
		return fmt.Errorf("sysbox: open cgroup: %w", err)
	}
	defer cg.Close()
	logf, err := os.OpenFile(c.ConsoleLog(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("sysbox: %w", err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "--- sysbox: boot %s at %s\n", c.name, time.Now().UTC().Format(time.RFC3339))
	cmd := exec.Command("/bin/sh", "-c", bootScript)
	cmd.Env = []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"SBX_LOWER=" + c.lower, "SBX_UPPER=" + c.upper(), "SBX_WORK=" + c.work(), "SBX_ROOT=" + c.root(),
		"SBX_BINDS=" + c.binds,
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS |
			syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET,
		UseCgroupFD: true,
		CgroupFD:    int(cg.Fd()),
		Setsid:      true,
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("sysbox: boot: %w", err)
	}
	done := make(chan struct{})
	go func() { // owned by the container: ends when PID 1 exits (kill does that)
		err := cmd.Wait()
		if f, ferr := os.OpenFile(c.ConsoleLog(), os.O_WRONLY|os.O_APPEND, 0); ferr == nil {
			fmt.Fprintf(f, "--- sysbox: PID 1 ended: %v\n", err)
			f.Close()
		}
		close(done)
	}()
	c.mu.Lock()
	c.cmd, c.pid, c.done = cmd, cmd.Process.Pid, done
	c.mu.Unlock()
	if err := c.waitBooted(ctx); err != nil {
		return err
	}
	return nil
}

// waitBooted polls until systemd reports running or degraded.
func (c *Container) waitBooted(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.boot)
	defer cancel()
	var last string
	for {
		c.mu.Lock()
		done := c.done
		c.mu.Unlock()
		select {
		case <-done:
			return fmt.Errorf("sysbox: %s: systemd exited during boot; console log %s ends:\n%s", c.name, c.ConsoleLog(), c.consoleTail())
		default:
		}
		out, _ := c.Exec(ctx, "systemctl", "is-system-running")
		last = strings.TrimSpace(string(out))
		switch last {
		case "running", "degraded":
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sysbox: %s: not up (last state %q): %w; console log %s ends:\n%s", c.name, last, ctx.Err(), c.ConsoleLog(), c.consoleTail())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// consoleTail returns the end of the console log, for error messages.
func (c *Container) consoleTail() []byte {
	b, _ := os.ReadFile(c.ConsoleLog())
	return tail(b, 3000)
}

// Restart is a power cut and a boot: PID 1 gets SIGKILL (which ends every
// process of the container and its mounts, /run included), then systemd
// boots again on the same upper directory. It returns when the system is up.
func (c *Container) Restart(ctx context.Context) error {
	if err := c.kill(); err != nil {
		return err
	}
	if err := c.start(ctx); err != nil {
		return fmt.Errorf("sysbox: restart: %w", err)
	}
	return nil
}

// kill stops the container: SIGKILL to PID 1, wait for it (the kernel ends
// every other process of the pid namespace first), then remove the cgroups
// systemd created under the container's cgroup.
func (c *Container) kill() error {
	c.mu.Lock()
	pid, done := c.pid, c.done
	c.mu.Unlock()
	if pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		select {
		case <-done:
		case <-time.After(time.Minute):
			return fmt.Errorf("sysbox: %s: PID 1 (host pid %d) did not exit after SIGKILL", c.name, pid)
		}
		c.mu.Lock()
		c.pid, c.cmd = 0, nil
		c.mu.Unlock()
	}
	// The pid namespace is gone, and with it every process of the
	// container: only the (empty) cgroups systemd created are left.
	return removeCgroups(c.cgroup, false)
}

// Close stops the container and removes its directory, cgroup and lock.
// It is safe to call more than once.
func (c *Container) Close() error {
	var errs []error
	if err := c.kill(); err != nil {
		errs = append(errs, err)
	}
	if err := killCgroup(c.cgroup, true); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("sysbox: remove %s: %w", c.dir, err))
	}
	if c.lock != nil && len(errs) == 0 {
		_ = os.Remove(c.dir + ".lock")
		c.lock.Close()
		c.lock = nil
	}
	return errors.Join(errs...)
}
