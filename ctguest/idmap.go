package ctguest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// maxIDMap bounds an id map file read (the kernel allows 340 lines).
const maxIDMap = 64 << 10

// NodeIDMaps returns the uid and gid maps of the container's user
// namespace as the node reads them (/proc/<pid>/uid_map and gid_map of
// the init pid lxc's monitor gives, lxc-info -p), not as anything inside
// the container reports them: the containment check judges its id map
// row on these. The maps read are the user namespace the init is in now,
// which its root could change (unshare one of its own, mapped as it
// likes, from a privileged container); the namespace lxc made the
// container with owns its pid namespace, which the init cannot leave:
// unless the two are the same namespace (NS_GET_USERNS of the pid
// namespace), there is no reading. The init's pid is asked again after
// the read: a pid that changed hands meanwhile is no reading either.
func (g *Guest) NodeIDMaps(ctx context.Context) (uid, gid string, err error) {
	pid, err := g.c.initPID(ctx, g.vmid)
	if err != nil {
		return "", "", err
	}
	proc := filepath.Join("/proc", strconv.Itoa(pid))
	if err := sameUserNS(proc); err != nil {
		return "", "", fmt.Errorf("ctguest: ct %d: %w", g.vmid, err)
	}
	var maps [2]string
	for i, f := range []string{"uid_map", "gid_map"} {
		b, err := readBounded(filepath.Join(proc, f), maxIDMap)
		if err != nil {
			return "", "", fmt.Errorf("ctguest: ct %d: %w", g.vmid, err)
		}
		maps[i] = string(b)
	}
	if again, err := g.c.initPID(ctx, g.vmid); err != nil || again != pid {
		return "", "", fmt.Errorf("ctguest: ct %d: its init changed while its maps were read (%d, then %d: %v)", g.vmid, pid, again, err)
	}
	return maps[0], maps[1], nil
}

// sameUserNS checks that the process at proc (/proc/<pid>) is in the user
// namespace that owns its pid namespace.
func sameUserNS(proc string) error {
	pidns, err := os.Open(filepath.Join(proc, "ns", "pid"))
	if err != nil {
		return err
	}
	defer pidns.Close()
	fd, err := unix.IoctlRetInt(int(pidns.Fd()), unix.NS_GET_USERNS)
	if err != nil {
		return fmt.Errorf("the owner of its pid namespace: %w", err)
	}
	owner := os.NewFile(uintptr(fd), "userns")
	defer owner.Close()
	var o, u unix.Stat_t
	if err := unix.Fstat(int(owner.Fd()), &o); err != nil {
		return err
	}
	if err := unix.Stat(filepath.Join(proc, "ns", "user"), &u); err != nil {
		return err
	}
	if o.Dev != u.Dev || o.Ino != u.Ino {
		return errors.New("its init is not in the user namespace its pid namespace belongs to (it made one of its own): no reading of the container's maps")
	}
	return nil
}

// initPID asks lxc's monitor for container vmid's init pid (lxc-info -p
// -H, run as lxc-attach is: the same prefix and lxc path).
func (c *Client) initPID(ctx context.Context, vmid int) (int, error) {
	info := "lxc-info"
	if strings.Contains(c.o.LXCAttach, "/") {
		info = filepath.Join(filepath.Dir(c.o.LXCAttach), "lxc-info")
	}
	argv := append(append([]string(nil), c.o.Prefix...), info, "-P", c.o.LXCPath, "-n", strconv.Itoa(vmid), "-p", "-H")
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = []string{hostPath}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("ctguest: ct %d: lxc-info: %w: %s", vmid, err, strings.TrimSpace(stderr.String()))
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("ctguest: ct %d: lxc-info gave no init pid (%q): is it running?", vmid, strings.TrimSpace(string(out)))
	}
	return pid, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, limit+1)
	n, err := f.Read(b)
	if err != nil {
		return nil, err
	}
	if int64(n) > limit {
		return nil, fmt.Errorf("%s: longer than %d bytes", path, limit)
	}
	return b[:n], nil
}
