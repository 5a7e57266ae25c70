package probe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openForWriting opens each path for writing and closes it unwritten: a
// sysctl or sysfs attribute acts on a write, never on the open, so the
// call changes nothing even where it succeeds. No O_CREAT, no O_TRUNC,
// no following a link.
func openForWriting(paths []string) []Call {
	calls := make([]Call, 0, len(paths))
	for _, p := range paths {
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
		if err == nil {
			unix.Close(fd)
		}
		calls = append(calls, Call{Op: "open " + p + " for writing", Errno: errnoName(err)})
	}
	return calls
}

// mountCalls mounts a disk file system with a directory as its device
// (the kernel refuses it for want of the node's CAP_SYS_ADMIN before it
// looks at the device; a caller that has it gets ENOTBLK, nothing is
// mounted) and opens a file by a made-up handle on the root's file
// system (refused without CAP_DAC_READ_SEARCH of the node; with it, the
// handle decodes to nothing).
func mountCalls(root string) ([]Call, error) {
	fstype, err := diskFS(filepath.Join(root, "proc/filesystems"))
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pve-inspect-probe-mnt-")
	if err != nil {
		return nil, fmt.Errorf("mount target: %w", err)
	}
	defer os.Remove(dir)
	err = unix.Mount(dir, dir, fstype, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	if err == nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	}
	calls := []Call{{Op: "mount " + fstype + " (a disk file system)", Errno: errnoName(err)}}
	calls = append(calls, Call{Op: "open_by_handle_at on /", Errno: errnoName(openByHandle())})
	return calls, nil
}

// openByHandle calls open_by_handle_at with a handle of zeros (type 1,
// FILEID_INO32_GEN: inode 0, generation 0, which no file has) on the
// root's file system.
func openByHandle() error {
	mfd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(mfd)
	h := struct {
		bytes uint32
		typ   int32
		fh    [8]byte
	}{bytes: 8, typ: 1}
	fd, _, e := unix.Syscall(unix.SYS_OPEN_BY_HANDLE_AT, uintptr(mfd), uintptr(unsafe.Pointer(&h)), uintptr(unix.O_RDONLY|unix.O_CLOEXEC))
	if e != 0 {
		return e
	}
	unix.Close(int(fd))
	return nil
}

// diskFS is the first file system of path (/proc/filesystems) that needs
// a device (no "nodev"): ext4 on most kernels.
func diskFS(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("file systems: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 1 && validFSName(f[0]) {
			return f[0], nil
		}
	}
	return "", errors.New("file systems: none needs a device")
}

// validFSName accepts a file system type as the kernel names them.
func validFSName(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// keyringCalls looks up the user and session keyrings without creating
// them (keyctl KEYCTL_GET_KEYRING_ID, create 0).
func keyringCalls() []Call {
	var calls []Call
	for _, k := range []struct {
		id   int
		name string
	}{{unix.KEY_SPEC_USER_KEYRING, "user"}, {unix.KEY_SPEC_SESSION_KEYRING, "session"}} {
		_, err := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, k.id, 0, 0, 0)
		calls = append(calls, Call{Op: "keyctl get the " + k.name + " keyring", Errno: errnoName(err)})
	}
	return calls
}

// moduleCalls makes the module calls with nothing to load or unload: the
// permission check comes first in each, so EPERM is the refusal and any
// other answer means the call got past it.
func moduleCalls() []Call {
	return []Call{
		{Op: "finit_module (descriptor -1)", Errno: errnoName(unix.FinitModule(-1, "", 0))},
		{Op: "init_module (an empty image)", Errno: errnoName(unix.InitModule(nil, ""))},
		{Op: "delete_module pve_inspect_no_such_module", Errno: errnoName(unix.DeleteModule("pve_inspect_no_such_module", unix.O_NONBLOCK))},
	}
}

// nestedProcFlag is the probe's internal flag for the nesting child.
const nestedProcFlag = "-nested-proc"

// nestingCalls starts the probe again (/proc/self/exe, which works after
// -self-remove) in new user, PID and mount namespaces, its uid and gid 0
// the probe's own, to mount a proc instance on a fresh directory: what a
// nested container's init does first. The child reports the mount's
// errno on its stdout (NestedProc).
func nestingCalls(ctx context.Context) ([]Call, error) {
	dir, err := os.MkdirTemp("", "pve-inspect-probe-nest-")
	if err != nil {
		return nil, fmt.Errorf("nesting: %w", err)
	}
	defer os.Remove(dir)
	cmd := exec.CommandContext(ctx, "/proc/self/exe", nestedProcFlag, dir)
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
		Pdeathsig:                  syscall.SIGKILL,
	}
	var out bytes.Buffer
	cmd.Stdout = &limitedWriter{w: &out, n: 64}
	clone := Call{Op: "clone new user, PID and mount namespaces"}
	if err := cmd.Start(); err != nil {
		var e syscall.Errno
		if !errors.As(err, &e) {
			return nil, fmt.Errorf("nesting: start the child: %w", err)
		}
		clone.Errno = errnoName(e)
		return []Call{clone}, nil
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("nesting: the child: %w", err)
	}
	got := strings.TrimSpace(out.String())
	if got != nestedOK && !errnoRE.MatchString(got) {
		return nil, fmt.Errorf("nesting: the child said %q", clip(got, 32))
	}
	mount := Call{Op: "mount proc in them"}
	if got != nestedOK {
		mount.Errno = got
	}
	return []Call{clone, mount}, nil
}

// nestedOK is the nesting child's answer when its proc mount succeeded.
const nestedOK = "OK"

// NestedProc is the nesting child (the probe run with -nested-proc DIR,
// in its new namespaces): it makes its mounts private, mounts proc on
// dir, unmounts it and writes OK or the mount's errno name to w.
func NestedProc(dir string, w io.Writer) int {
	_ = unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "")
	err := unix.Mount("proc", dir, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	if err == nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		fmt.Fprintln(w, nestedOK)
		return ExitOK
	}
	fmt.Fprintln(w, errnoName(err))
	return ExitOK
}

// limitedWriter keeps the first n bytes written to it.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(b []byte) (int, error) {
	if l.n > 0 {
		k := min(l.n, len(b))
		if _, err := l.w.Write(b[:k]); err != nil {
			return 0, err
		}
		l.n -= k
	}
	return len(b), nil
}
