package qga

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// The direct exec is the collected exec of a request that asks for none of
// the wrapper's features (no stdin, env, cwd or user; argv valid UTF-8, so
// that it travels in JSON as it is): one guest-exec with capture-output,
// so the agent itself collects the output (up to its 16 MiB cap per
// stream, flagging what it drops) and the client cuts it to the limit; the
// command's exit code or signal comes back from the agent unchanged.
//
// Tagged (the default): guest-exec runs the command itself, with the
// fixed base environment (BaseEnv, execenv.go) plus
// PVE_INSPECT_EXEC=<32 random hex digits>, fresh per exec. Every process
// the command starts inherits the entry, and a kill finds them by it: one
// guest-exec of a sh script that SIGKILLs every process whose
// /proc/PID/environ holds that exact NUL-delimited entry (grep -z -x -F),
// repeated while new ones appear. That reaches children that called
// setsid themselves and orphans reparented to init, which a session and
// group kill misses; it never reaches the agent or another exec (they
// carry no tag, or another). It misses a process that exec'd with a
// cleared environment or overwrote its initial environment area (as
// setproctitle does): the VM is the security boundary, the timeout is
// resource management. The command stays in qemu-ga's process group and
// session, so a command that signals its own group (`kill 0`, the
// `trap 'kill 0' EXIT` idiom) signals the agent too. When the agent
// cannot start the program (guest-exec fails: not found, not executable),
// the request is run once more through setsid, so that it ends like on
// the other paths (127 or 126 and setsid's message on stderr); nothing ran
// the first time.
//
// Through setsid (with Options.ExecOwnSession, or when the agent could
// not start the program on the tagged path): guest-exec, with BaseEnv,
// runs util-linux's setsid with the command as its arguments. setsid forks
// only when its caller leads a process group, and a child of qemu-ga does
// not, so setsid costs an exec, not a spawn: it calls setsid() and execs
// the command, which keeps the pid guest-exec reported, leads a new
// session and process group, and is killed as a tree by group and session
// like on the other paths; a command that cannot be found or run ends
// with 127 or 126 (setsid's own codes). A guest without setsid gets the
// wrapper's collected path.
//
// qemu-ga reports the command exited only once its output pipes are
// closed, so a background process that keeps the command's stdout or
// stderr open would hold the result. Once the command has run a while
// (directProbeFirst, then at doubling intervals up to directProbeMax) the
// client asks the guest whether the command itself is gone; if so, the
// processes of its tag (or of its session and group) that still hold one
// of the agent's pipes are killed, and the result (the command's own exit
// status) comes right after. Background processes that redirected their
// output (`nohup cmd >log 2>&1 &`) are not touched. A timeout kills the
// whole tree.

// setsidPath is util-linux's setsid in the guest.
const setsidPath = "/usr/bin/setsid"

// directReplyBound bounds the raw bytes of a status reply: both streams at
// the agent's capture cap, in base64, plus the envelope (on the direct path
// the agent decides how much it sends, not the limit). It costs reading
// time only: what is kept of a reply is bounded by the request's output
// limit (replycut.go).
var directReplyBound = 2*base64.StdEncoding.EncodedLen(agentOutputCap) + replyOverhead

const (
	// directHeld is how long the session that starts a direct exec keeps
	// its connection to poll the young command (a quick command then
	// costs one connection); Proxmox's pings wait at most this long.
	directHeld = 25 * time.Millisecond
	// directProbeFirst and directProbeMax space the checks for a command
	// that exited while background processes hold its output.
	directProbeFirst = 100 * time.Millisecond
	directProbeMax   = 5 * time.Second
)

// directPlan reports whether req can run without the wrapper.
func directPlan(req *ExecRequest) bool {
	if req.Stdin != nil || len(req.Env) > 0 || req.Cwd != "" || req.User != "" {
		return false
	}
	for _, a := range req.Argv {
		if !utf8.ValidString(a) {
			return false
		}
	}
	return true
}

// directRun is how one direct exec is started and ended.
type directRun struct {
	argv  []string
	env   []string // the whole environment; nil: BaseEnv
	input []byte   // guest-exec's input-data (nil: none)
	// kill kills the command's tree; holders kills the background
	// processes that hold the agent's pipes once the command is gone.
	kill    func(ctx context.Context, pid int) error
	holders func(ctx context.Context, pid int) error
}

// taggedRun runs the command itself with BaseEnv plus a fresh tag; kills
// find the tree by the tag.
func (a *Agent) taggedRun(req *ExecRequest) directRun {
	tag := randomTag() + randomTag()
	return directRun{
		argv:    req.Argv,
		env:     taggedEnv(tag),
		kill:    func(ctx context.Context, pid int) error { return a.killTagged(ctx, tag, pid) },
		holders: func(ctx context.Context, pid int) error { return a.endTaggedHolders(ctx, tag, pid) },
	}
}

// setsidRun runs the command through setsid; kills find the tree by its
// session and group.
func (a *Agent) setsidRun(req *ExecRequest) directRun {
	return directRun{
		argv:    append([]string{setsidPath, "--"}, req.Argv...),
		kill:    a.killDirect,
		holders: a.endHolders,
	}
}

// errNotStarted marks a direct exec whose program the agent refused to
// start (guest-exec failed: not found, not executable, or no setsid).
var errNotStarted = errors.New("agent did not start the program")

// execDirect runs req on the direct path: tagged, or through setsid with
// Options.ExecOwnSession. A program the agent cannot start on the tagged
// path is run through setsid, which ends with setsid's 127 or 126 and its
// message, like the wrapper; a guest without setsid gets the wrapper's
// collected path.
func (a *Agent) execDirect(ctx context.Context, req *ExecRequest, limit int64) (*ExecResult, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	if !a.c.opts.ExecOwnSession {
		res, err := a.execCaptured(ctx, req, limit, a.taggedRun(req))
		if !errors.Is(err, errNotStarted) {
			return res, err
		}
	}
	res, err := a.execCaptured(ctx, req, limit, a.setsidRun(req))
	if errors.Is(err, errNotStarted) {
		return a.execFast(ctx, req, limit)
	}
	return res, err
}

// execCaptured starts run with the agent capturing its output and waits
// for its result.
func (a *Agent) execCaptured(ctx context.Context, req *ExecRequest, limit int64, run directRun) (*ExecResult, error) {
	res := &ExecResult{}
	var st *guestExec
	var start time.Time
	p := newPoller()
	held := directHeld
	if req.Timeout > 0 {
		held = min(held, req.Timeout)
	}
	err := a.session(ctx, func(cn *conn) (err error) {
		if res.PID, err = cn.execStartEnv(run.argv, run.env, run.input, true); err != nil {
			return err
		}
		run.input = nil // the agent has it: not held while the command runs
		start = time.Now()
		for time.Since(start) < held {
			if st, err = cn.execStatus(res.PID, limit); err != nil || st.Exited {
				return err
			}
			if err := sleepCtx(ctx, p.next()); err != nil {
				return err
			}
		}
		return nil
	})
	var ae *AgentError
	switch {
	case res.PID == 0 && errors.As(err, &ae):
		return nil, fmt.Errorf("qga exec: start: %w: %w", errNotStarted, err)
	case res.PID == 0 && err != nil:
		return nil, fmt.Errorf("qga exec: start: %w", err)
	case err != nil && ctx.Err() != nil:
		return nil, a.abandonWith(ctx, res.PID, run.kill)
	case err != nil:
		return nil, fmt.Errorf("qga exec: poll: %w", err)
	}
	end, err := a.waitDirect(ctx, req, limit, res.PID, start, p, st, run)
	if err != nil {
		return nil, err
	}
	if err := collect(res, end.st, limit); err != nil {
		return nil, err
	}
	end.st.outcome(res)
	res.TimedOut = end.timedOut
	return res, nil
}

// directEnd is how a direct exec ended.
type directEnd struct {
	st       *guestExec
	timedOut bool
}

// waitDirect polls a started direct exec until the agent reports it
// exited (st when it already did), killing it on timeout and ending
// background holders of its output once it is gone.
func (a *Agent) waitDirect(ctx context.Context, req *ExecRequest, limit int64, pid int, start time.Time, p *poller, st *guestExec, run directRun) (directEnd, error) {
	killed := false
	var firstKill, lastKill time.Time
	probeEvery := directProbeFirst
	nextProbe := start.Add(probeEvery)
	for st == nil || !st.Exited {
		if ctx.Err() != nil {
			return directEnd{}, a.abandonWith(ctx, pid, run.kill)
		}
		err := a.session(ctx, func(cn *conn) (err error) {
			st, err = cn.execStatus(pid, limit)
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return directEnd{}, a.abandonWith(ctx, pid, run.kill)
			}
			return directEnd{}, fmt.Errorf("qga exec: poll: %w", err)
		}
		if st.Exited {
			break
		}
		// Killed only after a status that found it running.
		if req.Timeout > 0 && time.Since(start) >= req.Timeout && time.Since(lastKill) > 500*time.Millisecond {
			// Repeated while the command lives: its children may fork
			// between the listing and the kill.
			if err := run.kill(ctx, pid); err != nil {
				if ctx.Err() != nil {
					return directEnd{}, a.abandonWith(ctx, pid, run.kill)
				}
				return directEnd{}, fmt.Errorf("qga exec: kill after timeout: %w", err)
			}
			if !killed {
				firstKill = time.Now()
			}
			killed, lastKill = true, time.Now()
		}
		if killed && time.Since(firstKill) > killGrace {
			return directEnd{}, fmt.Errorf("qga exec: pid %d or a process holding its output still running %v after SIGKILL", pid, killGrace)
		}
		if !killed && time.Now().After(nextProbe) {
			if err := run.holders(ctx, pid); err != nil {
				if ctx.Err() != nil {
					return directEnd{}, a.abandonWith(ctx, pid, run.kill)
				}
				return directEnd{}, fmt.Errorf("qga exec: check for background holders: %w", err)
			}
			probeEvery = min(2*probeEvery, directProbeMax)
			nextProbe = time.Now().Add(probeEvery)
		}
		if err := sleepCtx(ctx, p.next()); err != nil {
			return directEnd{}, a.abandonWith(ctx, pid, run.kill)
		}
	}
	return directEnd{st: st, timedOut: killed}, nil
}

// killDirectScript kills the session and process group led by the direct
// command $1, and the command itself while its parent is the agent (the
// shell's parent) in case setsid has not run yet. It never names the
// agent's own group: before setsid there is no group $1. While the session
// or group has members the kernel does not reuse the number $1; only when
// the command is gone and every holder of its output escaped into a
// session of its own could a reused $1 be hit.
const killDirectScript = "PATH=" + toolPath + "\n" + `p=$1
pkill -9 -s "$p" 2>/dev/null
kill -9 -"$p" 2>/dev/null
if read -r s 2>/dev/null </proc/"$p"/stat; then
	set -- ${s##*") "}
	[ "$2" = "$PPID" ] && kill -9 "$p" 2>/dev/null
fi
exit 0`

// killDirect kills a direct exec's tree.
func (a *Agent) killDirect(ctx context.Context, pid int) error {
	_, err := a.run(ctx, []string{"/bin/sh", "-c", killDirectScript, "pve-inspect-kill", strconv.Itoa(pid)})
	return err
}

// endHoldersScript exits 3 while the direct command $1 runs (a zombie
// counts as gone); once it is gone, it kills the processes of its session
// and group that hold one of the agent's pipes (the agent is the shell's
// parent): the background processes that keep the output open. While they
// live the session and group keep the number $1 from being reused.
const endHoldersScript = "PATH=" + toolPath + "\n" + `p=$1
if read -r s 2>/dev/null </proc/"$p"/stat; then
	set -- ${s##*") "}
	[ "$1" = Z ] || exit 3
fi
a=" $(ls -l /proc/$PPID/fd 2>/dev/null | grep -o 'pipe:\[[0-9]*\]' | tr '\n' ' ')"
for q in $(pgrep -s "$p"; pgrep -g "$p"); do
	for l in $(ls -l /proc/"$q"/fd 2>/dev/null | grep -o 'pipe:\[[0-9]*\]'); do
		case $a in *" $l "*) kill -9 "$q" 2>/dev/null; break ;; esac
	done
done
exit 0`

// endHolders kills the background holders of a direct exec's output once
// the command itself is gone; while it runs, it does nothing.
func (a *Agent) endHolders(ctx context.Context, pid int) error {
	r, err := a.run(ctx, []string{"/bin/sh", "-c", endHoldersScript, "pve-inspect-holders", strconv.Itoa(pid)})
	if err != nil {
		return err
	}
	if r.ExitCode != 0 && r.ExitCode != 3 {
		return r.err()
	}
	return nil
}

// killTaggedScript kills every process whose initial environment holds
// the exact entry PVE_INSPECT_EXEC=$1 (grep -z matches whole NUL-delimited
// entries), repeating while new ones appear (a child may fork between the
// listing and the kill), and the command $2 itself while it is the agent's
// (the shell's parent's) child and not a zombie, in case it overwrote its
// environment area. The agent and this script carry no tag.
const killTaggedScript = "PATH=" + toolPath + "\n" + `t=PVE_INSPECT_EXEC=$1 p=$2 i=0
if read -r s 2>/dev/null </proc/"$p"/stat; then
	set -- ${s##*") "}
	[ "$1" != Z ] && [ "$2" = "$PPID" ] && kill -9 "$p" 2>/dev/null
fi
while l=$(grep -lsxzF -e "$t" /proc/[0-9]*/environ); [ -n "$l" ] && [ $i -lt 50 ]; do
	for f in $l; do f=${f#/proc/}; kill -9 "${f%/environ}" 2>/dev/null; done
	i=$((i+1))
done
exit 0`

// killTagged kills a tagged exec's tree.
func (a *Agent) killTagged(ctx context.Context, tag string, pid int) error {
	_, err := a.run(ctx, []string{"/bin/sh", "-c", killTaggedScript, "pve-inspect-kill", tag, strconv.Itoa(pid)})
	return err
}

// endTaggedHoldersScript exits 3 while the tagged command $2 runs (still
// the agent's child and not a zombie); once it is gone, it kills the
// processes tagged PVE_INSPECT_EXEC=$1 that hold one of the agent's pipes
// (the agent is the shell's parent): the background processes that keep
// the output open. Tagged processes that redirected their output are left.
const endTaggedHoldersScript = "PATH=" + toolPath + "\n" + `t=PVE_INSPECT_EXEC=$1 p=$2
if read -r s 2>/dev/null </proc/"$p"/stat; then
	set -- ${s##*") "}
	[ "$1" = Z ] || [ "$2" != "$PPID" ] || exit 3
fi
a=" $(ls -l /proc/$PPID/fd 2>/dev/null | grep -o 'pipe:\[[0-9]*\]' | tr '\n' ' ')"
for f in $(grep -lsxzF -e "$t" /proc/[0-9]*/environ); do
	q=${f#/proc/}; q=${q%/environ}
	for l in $(ls -l /proc/"$q"/fd 2>/dev/null | grep -o 'pipe:\[[0-9]*\]'); do
		case $a in *" $l "*) kill -9 "$q" 2>/dev/null; break ;; esac
	done
done
exit 0`

// endTaggedHolders kills the background holders of a tagged exec's output
// once the command itself is gone; while it runs, it does nothing.
func (a *Agent) endTaggedHolders(ctx context.Context, tag string, pid int) error {
	r, err := a.run(ctx, []string{"/bin/sh", "-c", endTaggedHoldersScript, "pve-inspect-holders", tag, strconv.Itoa(pid)})
	if err != nil {
		return err
	}
	if r.ExitCode != 0 && r.ExitCode != 3 {
		return r.err()
	}
	return nil
}
