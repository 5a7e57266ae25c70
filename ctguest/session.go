package ctguest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// session is one started job: lxc-attach runs in the exec cgroup, the
// daemon holds stdin's write end and the output pipes' read ends. Its
// fields are the calling goroutine's (loop's).
type session struct {
	j      *job
	cg     *execCgroup
	cmd    *exec.Cmd
	waited <-chan error // deathsig's: lxc-attach was reaped
	stdin  *os.File
	stdout *os.File
	stderr *os.File

	k        *killer
	pre      preamble
	oc       outcome
	early    []byte // stderr before the marker
	abortErr error
}

// abort ends the job with err (the first one wins) and kills it.
func (s *session) abort(err error) {
	if s.abortErr == nil {
		s.abortErr = err
	}
	s.k.kill(killAbort)
}

// deliver hands a chunk of output to the job. Stderr is held back until
// the marker came (before it, it is lxc-attach's); stdout goes through
// the preamble first.
func (s *session) deliver(ch chunk) error {
	if ch.stream == 1 {
		if !s.oc.started {
			s.early = append(s.early, ch.b[:min(len(ch.b), earlyMax-len(s.early))]...)
			if len(s.early) == earlyMax {
				s.j.errOut.truncated = true
			}
			return nil
		}
		return s.j.errOut.put(ch.b)
	}
	b := ch.b
	if !s.pre.done() {
		var err error
		if b, err = s.pre.feed(b); err != nil {
			return fmt.Errorf("%w: the container's reply: %w", sandbox.ErrGuestProtocol, err)
		}
		if s.pre.started && !s.oc.started {
			s.oc.started = true
			if err := s.j.errOut.put(s.early); err != nil {
				return err
			}
			s.early = nil
		}
		if !s.pre.done() {
			return nil
		}
		if s.j.onSize != nil {
			if err := s.j.onSize(s.pre.size); err != nil {
				return err
			}
		}
	}
	return s.j.out.put(b)
}

// loop feeds stdin, hands the output to the job's sinks from the calling
// goroutine, and ends once lxc-attach exited and both output pipes are
// drained. When lxc-attach exits, whatever the command left in the exec
// cgroup is killed, so the pipes' remaining bytes are all there is. Every
// goroutine it starts has ended when it returns (but deathsig's, when
// lxc-attach outlives its SIGKILL by KillGrace).
func (c *Client) loop(ctx context.Context, s *session) (*outcome, error) {
	chunks := make(chan chunk)
	readers := [2]*pipeReader{
		startReader(s.stdout, 0, chunks, c.o.DrainGrace),
		startReader(s.stderr, 1, chunks, c.o.DrainGrace),
	}
	stdinDone := make(chan error, 1)
	go feed(s.stdin, s.j.stdin, stdinDone)
	s.k = &killer{cg: s.cg, killed: make(chan struct{})}
	stop, watchDone := make(chan struct{}), make(chan struct{})
	go s.k.watch(ctx, s.j.timeout, stop, watchDone)

	open, exited, status := 2, false, false
	var grace <-chan time.Time
	killed, waited := s.k.killed, s.waited
	for open > 0 || !exited {
		select {
		case ch := <-chunks:
			if ch.eof {
				open--
			} else if s.abortErr == nil { // once aborted, the rest is dropped
				if err := s.deliver(ch); err != nil {
					s.abort(err)
				}
			}
		case <-waited:
			waited, exited, status = nil, true, true
			s.k.markExited()
			c.reap(s.cg, readers)
		case err := <-stdinDone:
			stdinDone = nil
			if err != nil && s.j.stdinMust {
				s.abort(fmt.Errorf("read source: %w", err))
			}
		case <-killed:
			killed, grace = nil, time.After(c.o.KillGrace)
		case <-grace:
			// lxc-attach outlived its SIGKILL: give up on it.
			grace, waited, exited = nil, nil, true
			s.abort(fmt.Errorf("ctguest: lxc-attach (pid %d) still alive %v after SIGKILL", s.cmd.Process.Pid, c.o.KillGrace))
			c.reap(s.cg, readers)
		}
	}
	close(stop)
	<-watchDone
	s.stdin.Close() // after the kill, if any: a write never takes a cut stream
	if stdinDone != nil {
		<-stdinDone
	}
	s.stdout.Close()
	s.stderr.Close()
	return s.end(ctx, status)
}

// end is the session's outcome: the exit status of lxc-attach (which is
// the command's; 128+signal when either was killed by a signal), or why
// the job ended early.
func (s *session) end(ctx context.Context, status bool) (*outcome, error) {
	s.oc.early = s.early
	if status {
		if ws, ok := s.cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
			s.oc.exitCode = ws.ExitStatus()
			if ws.Signaled() {
				s.oc.exitCode = 128 + int(ws.Signal())
			}
		}
	}
	s.oc.timedOut = s.k.reason == killTimeout
	switch {
	case s.k.err != nil:
		return nil, s.k.err
	case s.k.reason == killCtx:
		return nil, fmt.Errorf("ctguest: %w", ctx.Err())
	case s.abortErr != nil:
		return &s.oc, s.abortErr
	}
	return &s.oc, nil
}

// reap kills what the command left in the exec cgroup, waits for it to
// be gone and makes the readers take only what the pipes hold.
func (c *Client) reap(cg *execCgroup, readers [2]*pipeReader) {
	_ = cg.kill()
	_ = waitEmpty(cg.dir, c.o.KillGrace)
	for _, r := range readers {
		r.drain()
	}
}
