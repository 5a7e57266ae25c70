package ctguest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// maxIDMap bounds an id map file read (the kernel allows 340 lines).
const maxIDMap = 64 << 10

// NodeIDMaps returns the uid and gid maps of the container's init as the
// node reads them (/proc/<pid>/uid_map and gid_map of the pid lxc's
// monitor gives, lxc-info -p), not as anything inside the container
// reports them: the containment check judges its id map row on these.
func (g *Guest) NodeIDMaps(ctx context.Context) (uid, gid string, err error) {
	pid, err := g.c.initPID(ctx, g.vmid)
	if err != nil {
		return "", "", err
	}
	var maps [2]string
	for i, f := range []string{"uid_map", "gid_map"} {
		b, err := readBounded(filepath.Join("/proc", strconv.Itoa(pid), f), maxIDMap)
		if err != nil {
			return "", "", fmt.Errorf("ctguest: ct %d: %w", g.vmid, err)
		}
		maps[i] = string(b)
	}
	return maps[0], maps[1], nil
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
