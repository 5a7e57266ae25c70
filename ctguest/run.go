package ctguest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/deathsig"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"golang.org/x/sys/unix"
)

// hostPath is lxc-attach's whole environment on the host: nothing of the
// daemon's (and --clear-env keeps even this from the container).
const hostPath = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"

// job is one script run in the container.
type job struct {
	sc *script
	// stdin feeds the script's standard input (nil: empty).
	stdin io.Reader
	// stdinMust: an error reading stdin ends the job (a write).
	stdinMust bool
	// timeout kills the job's processes after this long (0: only ctx).
	timeout time.Duration
	out     sink
	errOut  sink
	// sized: a size line follows the marker; onSize (optional) gets it
	// before the first payload byte.
	sized  bool
	onSize func(int64) error
}

// sink takes one payload stream up to its limit.
type sink struct {
	w     io.Writer // nil: kept nowhere
	limit int64
	// strict: a stream past its limit ends the job (errTooLarge), after
	// the bytes up to the limit are delivered.
	strict    bool
	n         int64
	truncated bool
}

// errTooLarge ends a job whose strict stream passed its limit.
var errTooLarge = errors.New("output larger than the cap")

// put delivers b up to the limit; bytes beyond it are dropped and flag
// the stream truncated.
func (s *sink) put(b []byte) error {
	if rest := s.limit - s.n; int64(len(b)) > rest {
		b = b[:rest]
		s.truncated = true
	}
	if len(b) > 0 && s.w != nil {
		k, err := s.w.Write(b)
		s.n += int64(k)
		if err != nil {
			return err
		}
	} else {
		s.n += int64(len(b))
	}
	if s.truncated && s.strict {
		return errTooLarge
	}
	return nil
}

// outcome is how a job ended.
type outcome struct {
	started  bool // the script's marker came: it ran
	exitCode int  // 128+signal when killed by a signal
	timedOut bool // the job's timeout killed it
	// early is what came on stderr before the marker (lxc-attach's
	// messages), at most earlyMax bytes.
	early []byte
}

// earlyMax bounds the stderr kept before the marker: lxc-attach's own
// messages, or a replaced /bin/sh's.
const earlyMax = 64 << 10

// Kill reasons.
const (
	killTimeout = iota + 1
	killCtx
	killAbort
)

// killer kills a job's cgroup for its timeout, its context or an abort,
// whichever comes first.
type killer struct {
	cg     *execCgroup
	mu     sync.Mutex
	exited bool
	reason int
	err    error
	killed chan struct{} // closed at the first kill
}

func (k *killer) kill(reason int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if reason == killTimeout && k.exited {
		return // the command ended first: not timed out
	}
	if k.reason == 0 {
		k.reason = reason
		close(k.killed)
	}
	if err := k.cg.kill(); err != nil && k.err == nil {
		k.err = err
	}
}

func (k *killer) markExited() {
	k.mu.Lock()
	k.exited = true
	k.mu.Unlock()
}

// watch kills for the timeout or the context until stop is closed.
func (k *killer) watch(ctx context.Context, timeout time.Duration, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-timer:
		k.kill(killTimeout)
	case <-ctx.Done():
		k.kill(killCtx)
	case <-stop:
	}
}

// attachArgv is the host command line that runs sc in container vmid.
func (c *Client) attachArgv(vmid int, sc *script) []string {
	argv := slices.Clone(c.o.Prefix)
	argv = append(argv, c.o.LXCAttach, "-P", c.o.LXCPath, "-n", strconv.Itoa(vmid),
		"--clear-env", "--elevated-privileges=CGROUP")
	for _, e := range qga.BaseEnv() {
		argv = append(argv, "-v", e)
	}
	argv = append(argv, "--")
	return append(argv, sc.argv()...)
}

// run runs j in container vmid and returns how it ended. An error is the
// job's abort (a writer's error, errTooLarge, a malformed preamble, an
// onSize error), the context's end, or a failure on the host side.
func (c *Client) run(ctx context.Context, vmid int, j *job) (oc *outcome, err error) {
	dir := c.o.CgroupDir(vmid)
	if err := checkContainerDir(dir, c.o.InnerCgroup); err != nil {
		return nil, err
	}
	p, err := newExecName(dir)
	if err != nil {
		return nil, err
	}
	// In use before it exists: a Sweep of this container never takes it
	// for one a dead daemon left.
	c.track(p, true)
	cg, err := newExecCgroup(p)
	if err != nil {
		c.track(p, false)
		return nil, err
	}
	defer func() {
		// A cgroup that could not be removed is no longer this call's:
		// Sweep may try again.
		c.track(cg.dir, false)
		if rerr := cg.remove(c.o.KillGrace); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	var pipes [3][2]*os.File // stdin, stdout, stderr: read and write ends
	for i := range pipes {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(pipes[:i])
			return nil, fmt.Errorf("ctguest: %w", err)
		}
		pipes[i] = [2]*os.File{r, w}
	}
	argv := c.attachArgv(vmid, j.sc)
	path, err := exec.LookPath(argv[0])
	if err != nil {
		closeAll(pipes[:])
		return nil, fmt.Errorf("ctguest: %w", err)
	}
	cmd := &exec.Cmd{Path: path, Args: argv, Env: []string{hostPath}, Dir: "/",
		Stdin: pipes[0][0], Stdout: pipes[1][1], Stderr: pipes[2][1],
		SysProcAttr: &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.fd.Fd())}}
	// lxc-attach hands every descriptor it inherits to the container:
	// none may be inherited but the three pipes.
	if err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC); err != nil {
		closeAll(pipes[:])
		return nil, fmt.Errorf("ctguest: mark descriptors close-on-exec: %w", err)
	}
	waited, err := deathsig.Start(cmd, syscall.SIGKILL)
	// The child holds its ends now; the daemon keeps stdin's write end and
	// the output pipes' read ends.
	for _, f := range []*os.File{pipes[0][0], pipes[1][1], pipes[2][1]} {
		f.Close()
	}
	if err != nil {
		closeAll([][2]*os.File{{pipes[0][1], pipes[1][0]}, {pipes[2][0], nil}})
		if errors.Is(err, syscall.E2BIG) {
			return nil, fmt.Errorf("%w: the command line is too long: %w", sandbox.ErrGuestInvalid, err)
		}
		return nil, fmt.Errorf("ctguest: %w", err)
	}
	return c.loop(ctx, &session{j: j, cg: cg, cmd: cmd, waited: waited,
		stdin: pipes[0][1], stdout: pipes[1][0], stderr: pipes[2][0], pre: preamble{sized: j.sized}})
}

// closeAll closes the files of pairs (nil ones skipped).
func closeAll(pairs [][2]*os.File) {
	for _, p := range pairs {
		for _, f := range p {
			if f != nil {
				f.Close()
			}
		}
	}
}
