package ctguest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Options configure a Client. The zero value fits a PVE 9 node.
type Options struct {
	// LXCPath is lxc's path, where each container has its directory
	// (lxc-attach -P; "" = /var/lib/lxc, Proxmox's).
	LXCPath string
	// CgroupDir returns container vmid's cgroup v2 directory: the one
	// lxc.cgroup.dir.container names, whose child InnerCgroup holds the
	// container (nil = /sys/fs/cgroup/lxc/<vmid>, what pve-container
	// writes on a pure cgroup v2 node).
	CgroupDir func(vmid int) string
	// InnerCgroup is the container's delegated inner cgroup
	// (lxc.cgroup.dir.container.inner; "" = "ns", pve-container's).
	InnerCgroup string
	// Prefix runs lxc-attach (a test bed: nsenter --net=<the node's
	// network namespace> --, as lxc's command socket is an abstract unix
	// socket in the monitor's network namespace); nil on a node.
	Prefix []string
	// LXCAttach is the lxc-attach program ("" = lxc-attach in PATH).
	LXCAttach string
	// OutputLimit caps each of an exec's stdout and stderr when the
	// request sets no limit (0 = 10 MiB, as qga's).
	OutputLimit int64
	// KillGrace bounds the wait for a killed exec's processes to be gone
	// (0 = 10 s).
	KillGrace time.Duration
	// DrainGrace bounds the wait for bytes another holder of an output
	// pipe took once the exec's processes are gone (0 = 1 s).
	DrainGrace time.Duration
}

// Client runs commands and file operations in a node's containers. One
// per daemon; safe for concurrent use.
type Client struct {
	o Options

	mu     sync.Mutex
	active map[string]bool // the exec cgroups in use
}

// New returns a Client with o's defaults filled in.
func New(o Options) *Client {
	if o.LXCPath == "" {
		o.LXCPath = "/var/lib/lxc"
	}
	if o.CgroupDir == nil {
		o.CgroupDir = func(vmid int) string { return filepath.Join("/sys/fs/cgroup/lxc", strconv.Itoa(vmid)) }
	}
	if o.InnerCgroup == "" {
		o.InnerCgroup = "ns"
	}
	if o.LXCAttach == "" {
		o.LXCAttach = "lxc-attach"
	}
	if o.OutputLimit == 0 {
		o.OutputLimit = 10 << 20
	}
	if o.KillGrace == 0 {
		o.KillGrace = 10 * time.Second
	}
	if o.DrainGrace == 0 {
		o.DrainGrace = time.Second
	}
	return &Client{o: o, active: map[string]bool{}}
}

func (c *Client) track(dir string, on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if on {
		c.active[dir] = true
	} else {
		delete(c.active, dir)
	}
}

// ErrExecsRemain is Sweep's error while exec cgroups of calls still
// running remain in a container's cgroup.
var ErrExecsRemain = errors.New("exec cgroups of running calls remain")

// Sweep kills and removes the exec cgroups in container vmid's cgroup
// that no call of this client uses: those a previous daemon left when it
// died mid-exec (lxc-attach dies with it, the container's processes of
// the exec do not). Those of calls still running stay (each call removes
// its own as it ends) and make it ErrExecsRemain: a container whose id is
// freed while one remains could not start again under that id (lxc
// makes lxc/<vmid> itself and fails on an existing one), so the caller
// tries again before it destroys the container.
func (c *Client) Sweep(vmid int) error {
	dir := c.o.CgroupDir(vmid)
	var busy []string
	err := sweep(dir, func(name string) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.active[filepath.Join(dir, name)] {
			busy = append(busy, name)
			return true
		}
		return false
	}, c.o.KillGrace)
	if len(busy) > 0 {
		err = errors.Join(err, fmt.Errorf("ct %d: %w: %s", vmid, ErrExecsRemain, strings.Join(busy, ", ")))
	}
	return err
}

// Guest is one container as the sandbox engine sees it.
type Guest struct {
	c    *Client
	vmid int
}

var _ sandbox.Guest = (*Guest)(nil)

// Guest returns container vmid.
func (c *Client) Guest(vmid int) *Guest { return &Guest{c: c, vmid: vmid} }

// pingTimeout bounds a Ping whose context has no deadline.
const pingTimeout = 30 * time.Second

// Ping runs the marker script in the container: it answers when
// lxc-attach attaches and the container's /bin/sh runs.
func (g *Guest) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	oc, err := g.c.run(ctx, g.vmid, &job{sc: pingScript(), errOut: sink{limit: 4 << 10}})
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("ctguest: ct %d: %w: %w", g.vmid, sandbox.ErrGuestTimeout, err)
		}
		return fmt.Errorf("ctguest: ct %d: %w: %w", g.vmid, sandbox.ErrGuestUnavailable, err)
	}
	if !oc.started || oc.exitCode != 0 {
		return fmt.Errorf("ctguest: ct %d: %w", g.vmid, notStarted(oc))
	}
	return nil
}

// notStarted explains a job whose script did not run.
func notStarted(oc *outcome) error {
	if oc.started {
		return fmt.Errorf("%w: the script ran but exited %d", sandbox.ErrGuestUnavailable, oc.exitCode)
	}
	if oc.timedOut {
		return fmt.Errorf("%w: the command did not start before the timeout", sandbox.ErrGuestTimeout)
	}
	return fmt.Errorf("%w: lxc-attach exited %d before the script ran: %s", sandbox.ErrGuestUnavailable, oc.exitCode, clip(oc.early))
}

// clip quotes at most 512 bytes of guest text for an error.
func clip(b []byte) string {
	const n = 512
	if len(b) > n {
		return strconv.Quote(string(b[:n])) + "..."
	}
	return strconv.Quote(string(bytes.TrimSpace(b)))
}

// execRequest is an exec, checked.
type execRequest struct {
	Argv        []string
	Env         map[string]string
	Cwd, User   string
	Stdin       []byte
	Timeout     time.Duration
	OutputLimit int64
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// request checks r as qga does: a program, no NUL anywhere, env names
// that are identifiers, no negative timeout or limit.
func request(r sandbox.GuestExec) (*execRequest, error) {
	if len(r.Argv) == 0 || r.Argv[0] == "" {
		return nil, fmt.Errorf("%w: empty argv", sandbox.ErrGuestInvalid)
	}
	noNUL := func(what, s string) error {
		if strings.IndexByte(s, 0) >= 0 {
			return fmt.Errorf("%w: %s contains NUL", sandbox.ErrGuestInvalid, what)
		}
		return nil
	}
	for i, a := range r.Argv {
		if err := noNUL("argv["+strconv.Itoa(i)+"]", a); err != nil {
			return nil, err
		}
	}
	for k, v := range r.Env {
		if !envName.MatchString(k) {
			return nil, fmt.Errorf("%w: env name %q is not an identifier", sandbox.ErrGuestInvalid, k)
		}
		if err := noNUL("env "+k, v); err != nil {
			return nil, err
		}
	}
	if err := errors.Join(noNUL("cwd", r.Cwd), noNUL("user", r.User)); err != nil {
		return nil, err
	}
	if r.Timeout < 0 || r.OutputLimit < 0 || r.Timeout > math.MaxInt64/int64(time.Second) {
		return nil, fmt.Errorf("%w: negative or impossible timeout or output limit", sandbox.ErrGuestInvalid)
	}
	return &execRequest{Argv: r.Argv, Env: r.Env, Cwd: r.Cwd, User: r.User, Stdin: r.Stdin,
		Timeout: time.Duration(r.Timeout) * time.Second, OutputLimit: r.OutputLimit}, nil
}

// Exec runs a command in the container and collects its output (see
// ExecStream).
func (g *Guest) Exec(ctx context.Context, r sandbox.GuestExec) (*apitype.ExecResult, error) {
	var out, errb bytes.Buffer
	res, err := g.ExecStream(ctx, r, &out, &errb)
	if err != nil {
		return nil, err
	}
	// empty, never nil: the API's result has the streams as strings
	res.Stdout, res.Stderr = append([]byte{}, out.Bytes()...), append([]byte{}, errb.Bytes()...)
	return res, nil
}

// ExecStream runs a command in the container and copies its output to
// stdout and stderr (nil discards) from the calling goroutine while it
// runs. A command that cannot be found or run is an ordinary result (127,
// 126), as is a cwd or user that cannot be set up (ExitSetupFailed) and a
// timeout (TimedOut, exit code 137). Each stream is cut at the request's
// OutputLimit (or Options.OutputLimit) and flagged truncated. When the
// command exits, or the timeout passes, or ctx ends, every process it
// started is killed. Errors wrap the sandbox guest sentinels, or are the
// context's or a writer's.
func (g *Guest) ExecStream(ctx context.Context, r sandbox.GuestExec, stdout, stderr io.Writer) (*apitype.ExecResult, error) {
	req, err := request(r)
	if err != nil {
		return nil, err
	}
	limit := req.OutputLimit
	if limit == 0 {
		limit = g.c.o.OutputLimit
	}
	j := &job{sc: execScript(req), timeout: req.Timeout,
		out: sink{w: stdout, limit: limit}, errOut: sink{w: stderr, limit: limit}}
	if len(req.Stdin) > 0 {
		j.stdin = bytes.NewReader(req.Stdin)
	}
	oc, err := g.c.run(ctx, g.vmid, j)
	if err != nil {
		return nil, fmt.Errorf("ctguest exec: ct %d: %w", g.vmid, err)
	}
	if !oc.started {
		return nil, fmt.Errorf("ctguest exec: ct %d: %w", g.vmid, notStarted(oc))
	}
	return &apitype.ExecResult{ExitCode: oc.exitCode, Stdout: []byte{}, Stderr: []byte{},
		StdoutTruncated: j.out.truncated, StderrTruncated: j.errOut.truncated, TimedOut: oc.timedOut}, nil
}

// checkPath validates a container path for the file calls: absolute,
// clean, no NUL (any other bytes travel as they are).
func checkPath(p string) error {
	switch {
	case p == "" || p[0] != '/':
		return fmt.Errorf("%w: path %q is not absolute", sandbox.ErrGuestInvalid, p)
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("%w: path contains NUL", sandbox.ErrGuestInvalid)
	case path.Clean(p) != p:
		return fmt.Errorf("%w: path %q is not clean (want %q)", sandbox.ErrGuestInvalid, p, path.Clean(p))
	}
	return nil
}
