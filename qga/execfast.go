package qga

import (
	"context"
	"encoding/base64"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"
)

// The collected exec (Exec without stdin) takes a shorter path than
// ExecStream: the wrapper shell stays the command's parent instead of
// exec'ing it, the command's output goes to guest files the shell created
// itself, and once the command exited the shell prints the files (at most
// limit+1 bytes each) to its own stdout and stderr, which the agent
// captures (capture-output). No guest-file-open is needed (qemu-ga writes
// its persistent state file on every open, the dominant cost of a short
// exec), and a poll is one guest-exec-status call. The command still runs
// as the leader of its own session and process group (setsid), so a
// timeout kills the whole tree; a background child keeps the output files,
// not the agent's pipes, so it does not delay the result.

// agentOutputCap is what qemu-ga keeps of each captured stream
// (GUEST_EXEC_MAX_OUTPUT in qga/commands.c); the fast path serves limits
// below it.
const agentOutputCap = 16 << 20

// fastPlan says whether req can take the collected path and with which
// output limit.
func (a *Agent) fastPlan(req *ExecRequest) (int64, bool) {
	if req.Stdin != nil {
		return 0, false
	}
	limit := req.OutputLimit
	if limit == 0 {
		limit = a.c.opts.OutputLimit
	}
	if limit <= 0 || limit >= agentOutputCap {
		return 0, false
	}
	return limit, true
}

// Signals whose death the wrapper passes on by dying of the same signal
// (those that terminate without a core dump and cannot be caught by the
// shell's own setup); any other status is passed on as an exit code.
const reraised = "129|130|137|141|142|143"

// toolPath is where the wrapper and the kill scripts find their own tools
// (mkdir, rm, head, grep, pgrep, ...), so that a guest's /usr/local/bin
// cannot stand in for them.
const toolPath = "/usr/sbin:/usr/bin:/sbin:/bin"

// fastWrapper renders the collected-path wrapper.
func fastWrapper(r *ExecRequest, dir, outPath, errPath string, limit int64) *script {
	s := &script{}
	d, o, e := s.param(dir), s.param(outPath), s.param(errPath)
	// The wrapper's own tools run in a subshell whose PATH is the system
	// directories only, so a guest's /usr/local/bin cannot stand in for
	// them (dash's `command -p` searches /usr/local/bin first).
	s.add(`[ -d %s ] || (PATH=%s; exec mkdir -p -m 0700 -- %s) || exit %d`, d, toolPath, d, ExitSetupFailed)
	// Write ends for the command, read ends (own offsets) for the shell;
	// the names go before the command runs.
	s.add(`exec 3>%s 4>%s 5<%s 6<%s || exit %d`, o, e, o, e, ExitSetupFailed)
	s.add(`(PATH=%s; exec rm -f -- %s %s)`, toolPath, o, e)
	runas, argv := commandSetup(s, r)
	s.add(`setsid -- %s%s >&3 2>&4 3>&- 4>&- 5<&- 6<&- </dev/null`, runas, argv)
	s.add(`rc=$?`)
	s.add(`exec 3>&- 4>&-`)
	s.add(`[ -s /proc/self/fd/5 ] && (PATH=%s; exec head -c %d) <&5`, toolPath, limit+1)
	s.add(`[ -s /proc/self/fd/6 ] && (PATH=%s; exec head -c %d) <&6 >&2`, toolPath, limit+1)
	s.add(`case $rc in %s) kill -$((rc-128)) $$ ;; esac`, reraised)
	s.add(`exit $rc`)
	return s
}

// killChildren kills the sessions and groups led by the children of the
// wrapper shell pid (the command), or the shell itself when it has none.
func (a *Agent) killChildren(ctx context.Context, pid int) error {
	_, err := a.run(ctx, []string{"/bin/sh", "-c",
		"PATH=" + toolPath + "\n" + `cs=$(pgrep -P "$1"); for c in $cs; do kill -9 -"$c" 2>/dev/null; pkill -9 -s "$c" 2>/dev/null; kill -9 "$c" 2>/dev/null; done; [ -n "$cs" ] || kill -9 "$1" 2>/dev/null; exit 0`,
		"pve-inspect-kill", strconv.Itoa(pid)})
	return err
}

// execFast runs req on the collected path.
func (a *Agent) execFast(ctx context.Context, req *ExecRequest, limit int64) (*ExecResult, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	dir := a.c.opts.GuestTempDir
	base := path.Join(dir, ".pve-inspect-"+randomTag())
	sc := fastWrapper(req, dir, base+".out", base+".err", limit)
	argv := append([]string{"/bin/sh", "-c", strings.Join(sc.lines, "\n"), "pve-inspect-exec"}, sc.args...)
	res := &ExecResult{}
	err := a.session(ctx, func(cn *conn) (err error) {
		res.PID, err = cn.execStart(argv, nil, true)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("qga exec: start: %w", err)
	}
	start := time.Now()
	p := newPoller()
	killed := false
	var firstKill, lastKill time.Time
	for {
		if ctx.Err() != nil {
			return nil, a.abandonWith(ctx, res.PID, a.killChildren)
		}
		var st *guestExec
		err := a.session(ctx, func(cn *conn) (err error) {
			st, err = cn.execStatus(res.PID, limit)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil, a.abandonWith(ctx, res.PID, a.killChildren)
			}
			return nil, fmt.Errorf("qga exec: poll: %w", err)
		}
		if st.Exited {
			st.outcome(res)
			if err := collect(res, st, limit); err != nil {
				return nil, err
			}
			res.TimedOut = killed
			return res, nil
		}
		// Killed only after a status that found it running.
		if req.Timeout > 0 && time.Since(start) >= req.Timeout && time.Since(lastKill) > 500*time.Millisecond {
			if err := a.killChildren(ctx, res.PID); err != nil {
				if ctx.Err() != nil {
					return nil, a.abandonWith(ctx, res.PID, a.killChildren)
				}
				return nil, fmt.Errorf("qga exec: kill after timeout: %w", err)
			}
			if !killed {
				firstKill = time.Now()
			}
			killed, lastKill = true, time.Now()
		}
		if killed && time.Since(firstKill) > killGrace {
			return nil, fmt.Errorf("qga exec: pid %d still running %v after SIGKILL", res.PID, killGrace)
		}
		if err := sleepCtx(ctx, p.next()); err != nil {
			return nil, a.abandonWith(ctx, res.PID, a.killChildren)
		}
	}
}

// collect decodes the captured streams into res, cut at limit.
func collect(res *ExecResult, st *guestExec, limit int64) error {
	for _, s := range []struct {
		data      string
		agentCut  bool
		out       *[]byte
		n         *int64
		truncated *bool
	}{
		{st.OutData, st.OutTrunc, &res.Stdout, &res.StdoutBytes, &res.StdoutTruncated},
		{st.ErrData, st.ErrTrunc, &res.Stderr, &res.StderrBytes, &res.StderrTruncated},
	} {
		b, err := base64.StdEncoding.DecodeString(s.data)
		if err != nil {
			return fmt.Errorf("qga exec: %w", &ProtocolError{Kind: KindMalformed, Command: "guest-exec-status", Err: fmt.Errorf("output: %w", err)})
		}
		if int64(len(b)) > limit {
			b, *s.truncated = b[:limit], true
		}
		*s.truncated = *s.truncated || s.agentCut
		*s.out, *s.n = b, int64(len(b))
	}
	return nil
}
