package qga

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ExecRequest is one command to run in the guest.
type ExecRequest struct {
	// Argv is the program (looked up in PATH) and its arguments. Any bytes
	// but NUL; arguments that are not valid UTF-8 are passed through intact.
	Argv []string
	// Stdin feeds the command's standard input; nil means /dev/null. Small
	// input travels inline in guest-exec, larger input is streamed into a
	// guest temp file first.
	Stdin io.Reader
	// Env is added to (and overrides) the base environment, BaseEnv (the
	// agent's own environment is never used). Names must be shell
	// identifiers.
	Env map[string]string
	// Cwd is the working directory ("" = the agent's, usually /).
	Cwd string
	// User runs the command as this user name or uid ("" = the agent's
	// user, root). Needs setpriv (util-linux) in the guest.
	User string
	// Timeout kills the command's whole tree in the guest after this long
	// (0 = only the context ends it): its process group and session, or
	// on the tagged direct path every process carrying its exec's tag.
	Timeout time.Duration
	// OutputLimit caps each of stdout and stderr (0 = the client's
	// OutputLimit, 10 MiB by default). Bytes beyond it are dropped and the
	// stream is flagged truncated; the command keeps running.
	OutputLimit int64
}

// ExecResult is how a command ended.
type ExecResult struct {
	PID      int  // guest pid of the command
	ExitCode int  // exit status; 128+Signal when killed by a signal
	Signal   int  // terminating signal, 0 when the command exited
	TimedOut bool // the command was killed because Timeout passed

	// Stdout and Stderr hold the output (Exec only; ExecStream writes it to
	// its writers and leaves these nil).
	Stdout, Stderr                   []byte
	StdoutBytes, StderrBytes         int64 // bytes delivered per stream (at most the limit)
	StdoutTruncated, StderrTruncated bool  // the stream had more than the limit
}

// Exit codes the exec wrapper itself uses when it cannot set up the
// command; 126 and 127 keep their shell meaning (not executable, not found).
const (
	// ExitSetupFailed: the working directory or user could not be set up
	// (the reason is on stderr).
	ExitSetupFailed = 125
)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (r *ExecRequest) validate() error {
	if len(r.Argv) == 0 || r.Argv[0] == "" {
		return fmt.Errorf("%w: empty argv", ErrInvalid)
	}
	check := func(what, s string) error {
		if strings.IndexByte(s, 0) >= 0 {
			return fmt.Errorf("%w: %s contains NUL", ErrInvalid, what)
		}
		return nil
	}
	for i, a := range r.Argv {
		if err := check("argv["+strconv.Itoa(i)+"]", a); err != nil {
			return err
		}
	}
	for k, v := range r.Env {
		if !envName.MatchString(k) {
			return fmt.Errorf("%w: env name %q is not an identifier", ErrInvalid, k)
		}
		if err := check("env "+k, v); err != nil {
			return err
		}
	}
	if err := check("cwd", r.Cwd); err != nil {
		return err
	}
	if err := check("user", r.User); err != nil {
		return err
	}
	if r.Timeout < 0 || r.OutputLimit < 0 {
		return fmt.Errorf("%w: negative timeout or output limit", ErrInvalid)
	}
	return nil
}

// script builds the guest-side wrapper: a POSIX sh script plus its
// positional parameters. User data only ever travels as parameters, never
// inside the script text; parameters that are not valid UTF-8 (JSON cannot
// carry them) travel as octal escapes and are decoded by printf.
type script struct {
	lines []string
	args  []string
}

// param adds s as a positional parameter and returns a quoted shell
// expression that expands to its exact bytes.
func (s *script) param(v string) string {
	s.args = append(s.args, "")
	n := len(s.args)
	if utf8.ValidString(v) {
		s.args[n-1] = v
		return `"${` + strconv.Itoa(n) + `}"`
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		fmt.Fprintf(&b, `\%03o`, v[i])
	}
	s.args[n-1] = b.String()
	name := "v" + strconv.Itoa(n)
	// printf's format holds only \ooo escapes; "x" protects trailing newlines.
	s.lines = append(s.lines, fmt.Sprintf(`%s=$(printf "${%d}"; echo x); %s=${%s%%x}`, name, n, name, name))
	return `"$` + name + `"`
}

func (s *script) add(format string, a ...any) { s.lines = append(s.lines, fmt.Sprintf(format, a...)) }

// wrapper renders the script that redirects the command's output into the
// guest files outPath and errPath (and stdin from inPath when set), unlinks
// them (the client holds open handles), sets up env, user and cwd and execs
// the command as the leader of a new session and process group, so that
// the pid guest-exec reports is the command's own and the whole tree can be
// killed by group and session.
func wrapper(r *ExecRequest, outPath, errPath, inPath string, inline bool) *script {
	s := &script{}
	o, e := s.param(outPath), s.param(errPath)
	s.add(`exec 1>>%s 2>>%s`, o, e)
	switch {
	case inPath != "":
		in := s.param(inPath)
		s.add(`exec 0<%s`, in)
		s.add(`rm -f -- %s %s %s`, o, e, in)
	case inline:
		s.add(`rm -f -- %s %s`, o, e)
	default:
		s.add(`exec 0</dev/null`)
		s.add(`rm -f -- %s %s`, o, e)
	}
	runas, argv := commandSetup(s, r)
	s.add(`exec setsid -- %s%s`, runas, argv)
	return s
}

// commandSetup adds the lines that set up PATH, user, environment and
// working directory, and returns the setpriv prefix (or "") and the
// quoted command line.
func commandSetup(s *script, r *ExecRequest) (runas, cmdline string) {
	s.add(`PATH=${PATH:-%s}; export PATH`, BasePath)
	if r.User != "" {
		u := s.param(r.User)
		s.add(`u=%s; g=$(id -g -- "$u" 2>/dev/null) || { echo "pve-inspect-exec: no such user: $u" >&2; exit %d; }`, u, ExitSetupFailed)
		s.add(`h=$(getent passwd "$u" 2>/dev/null | cut -d: -f6); HOME=${h:-/}; USER=$u; LOGNAME=$u; export HOME USER LOGNAME`)
		runas = `setpriv --reuid="$u" --regid="$g" --init-groups -- `
	}
	keys := make([]string, 0, len(r.Env))
	for k := range r.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		s.add(`export %s`, s.param(k+"="+r.Env[k]))
	}
	if r.Cwd != "" {
		d := s.param(r.Cwd)
		s.add(`cd %s || { echo "pve-inspect-exec: cannot enter working directory" >&2; exit %d; }`, d, ExitSetupFailed)
	}
	argv := make([]string, len(r.Argv))
	for i, a := range r.Argv {
		argv[i] = s.param(a)
	}
	return runas, strings.Join(argv, " ")
}

// guestExec is the answer to guest-exec-status.
type guestExec struct {
	Exited   bool   `json:"exited"`
	ExitCode *int   `json:"exitcode"`
	Signal   *int   `json:"signal"`
	OutData  string `json:"out-data"`
	ErrData  string `json:"err-data"`
	OutTrunc bool   `json:"out-truncated"`
	ErrTrunc bool   `json:"err-truncated"`
}

func (cn *conn) execStart(argv []string, input []byte, capture bool) (int, error) {
	return cn.execStartEnv(argv, nil, input, capture)
}

// execStartEnv is execStart with the command's whole environment (env nil:
// BaseEnv). qemu-ga does not merge the list with its own environment, and
// the client always sends one, so no command it starts inherits the
// agent's environment (execenv.go).
func (cn *conn) execStartEnv(argv, env []string, input []byte, capture bool) (int, error) {
	if env == nil {
		env = BaseEnv()
	}
	args := struct {
		Path    string   `json:"path"`
		Arg     []string `json:"arg,omitempty"`
		Env     []string `json:"env,omitempty"`
		Input   string   `json:"input-data,omitempty"`
		Capture bool     `json:"capture-output,omitempty"`
	}{Path: argv[0], Arg: argv[1:], Env: env, Capture: capture}
	if input != nil {
		args.Input = base64.StdEncoding.EncodeToString(input)
	}
	var ret struct {
		PID *int `json:"pid"`
	}
	if err := cn.call("guest-exec", args, &ret); err != nil {
		return 0, err
	}
	if ret.PID == nil || *ret.PID <= 0 {
		return 0, cn.fail(KindMalformed, "guest-exec", errors.New("no pid in reply"))
	}
	return *ret.PID, nil
}

// execStatus polls pid (guest-exec-status). Its streams are wanted up to
// limit bytes each: the reply is read through a cutter (replycut.go), so
// it costs about what limit asks for whatever the agent sends, and output
// data on a status that has not exited is a protocol error.
func (cn *conn) execStatus(pid int, limit int64) (*guestExec, error) {
	const cmd = "guest-exec-status"
	args := strconv.AppendInt([]byte(`{"pid":`), int64(pid), 10)
	args = append(args, '}')
	id, end, err := cn.send(cmd, args)
	if err != nil {
		return nil, err
	}
	cut := statusCut(limit)
	line, release, err := cn.readLineCut(cmd, end, cut, 4*cut+replyOverhead, directReplyBound)
	if err != nil {
		return nil, err
	}
	defer release()
	var st guestExec
	if err := cn.finish(cmd, id, line, &st); err != nil {
		return nil, err
	}
	if st.Exited && st.ExitCode == nil && st.Signal == nil {
		return nil, cn.fail(KindMalformed, cmd, errors.New("exited without exit code or signal"))
	}
	if !st.Exited && (st.OutData != "" || st.ErrData != "") {
		return nil, cn.fail(KindMalformed, cmd, errDataWhileRunning)
	}
	return &st, nil
}

// outcome fills code and signal from an exited status.
func (st *guestExec) outcome(res *ExecResult) {
	switch {
	case st.Signal != nil:
		res.Signal = *st.Signal
		res.ExitCode = 128 + *st.Signal
	case st.ExitCode != nil:
		res.ExitCode = *st.ExitCode
	}
}

// poller yields the short adaptive wait between status polls: a tenth of
// the time the command has run so far, between 1 ms and 50 ms. A quick
// command is seen to end within about a millisecond, a long one costs at
// most 20 polls a second, and detection lags by at most ~10%.
type poller struct{ start time.Time }

const (
	pollMin = time.Millisecond
	pollMax = 50 * time.Millisecond
)

func newPoller() *poller { return &poller{start: time.Now()} }

func (p *poller) next() time.Duration {
	return min(max(time.Since(p.start)/10, pollMin), pollMax)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// outputEvery is how often the output of a running command is read (it
// is always read to the end once the command exited).
const outputEvery = 100 * time.Millisecond

// helperTimeout bounds the internal helper commands (mkdir, chmod+mv, kill,
// rm), which take milliseconds on any sane guest.
const helperTimeout = time.Minute

// killGrace bounds how long a command may survive its SIGKILL before the
// call gives up on it.
const killGrace = 30 * time.Second

// runResult is the outcome of a small internal command.
type runResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

func (r *runResult) err() error {
	msg := strings.TrimSpace(clipString(string(r.Stderr), maxDescLen))
	return fmt.Errorf("exit status %d: %s", r.ExitCode, msg)
}

// runOutputLimit is what run keeps of each stream of a helper command
// (their output is a few lines; the agent's environment, execenv.go, a
// few KiB).
const runOutputLimit = 1 << 20

// run executes a small internal helper command (mkdir, mv, kill, rm) with
// the agent capturing its (tiny) output, and waits for it.
func (a *Agent) run(ctx context.Context, argv []string) (*runResult, error) {
	return a.runEnv(ctx, argv, nil)
}

// runEnv is run with the helper's whole environment (nil: BaseEnv).
func (a *Agent) runEnv(ctx context.Context, argv, env []string) (*runResult, error) {
	ctx, cancel := context.WithTimeout(ctx, helperTimeout)
	defer cancel()
	var pid int
	if err := a.session(ctx, func(cn *conn) (err error) {
		pid, err = cn.execStartEnv(argv, env, nil, true)
		return err
	}); err != nil {
		return nil, err
	}
	p := newPoller()
	for {
		var st *guestExec
		if err := a.session(ctx, func(cn *conn) (err error) {
			st, err = cn.execStatus(pid, runOutputLimit)
			return err
		}); err != nil {
			return nil, err
		}
		if st.Exited {
			var res ExecResult
			st.outcome(&res)
			var out ExecResult
			if err := collect(&out, st, runOutputLimit); err != nil {
				return nil, err
			}
			return &runResult{ExitCode: res.ExitCode, Stdout: out.Stdout, Stderr: out.Stderr}, nil
		}
		if err := sleepCtx(ctx, p.next()); err != nil {
			return nil, err
		}
	}
}

// killGroup kills the process group and session led by pid (and pid
// itself, in case it has not become a leader yet).
func (a *Agent) killGroup(ctx context.Context, pid int) error {
	p := strconv.Itoa(pid)
	_, err := a.run(ctx, []string{"/bin/sh", "-c",
		`kill -9 -"$1" 2>/dev/null; kill -9 "$1" 2>/dev/null; pkill -9 -s "$1" 2>/dev/null; exit 0`,
		"pve-inspect-kill", p})
	return err
}

// outStream is one output stream being collected from its guest file.
type outStream struct {
	h         int64
	w         io.Writer
	n, limit  int64
	truncated bool
	done      bool // limit reached, or drained after exit
}

// take reads one chunk of the stream (within the session) and returns it,
// cut at the limit. Once the command has exited, the stream is done at its
// first EOF (a background child may keep appending; the limit bounds it).
func (s *outStream) take(cn *conn, chunk int, exited bool) ([]byte, error) {
	if s.done {
		return nil, nil
	}
	count := int(min(int64(chunk), s.limit-s.n+1))
	data, eof, err := cn.fileRead(s.h, count)
	if err != nil {
		return nil, err
	}
	if rest := s.limit - s.n; int64(len(data)) > rest {
		data = data[:rest]
		s.truncated, s.done = true, true
	}
	if exited && (eof || len(data) == 0) {
		s.done = true // an empty read without EOF would loop forever
	}
	return data, nil
}

// Exec runs a command in the guest and collects its output. A command that
// cannot be found or run is an ordinary result (exit code 127 or 126), as
// is a timeout (TimedOut, killed by signal 9, exit code 137). Errors are
// for the channel and for invalid requests. A request without stdin, env,
// cwd or user runs directly (the command itself, tagged through its
// environment, or under setsid) with the agent capturing its output; the
// others go through the wrapper (the package documentation says which
// path a request takes and how background children fare).
func (a *Agent) Exec(ctx context.Context, req ExecRequest) (*ExecResult, error) {
	if limit, ok := a.fastPlan(&req); ok {
		if directPlan(&req) {
			return a.execDirect(ctx, &req, limit)
		}
		return a.execFast(ctx, &req, limit)
	}
	var out, errb bytes.Buffer
	res, err := a.ExecStream(ctx, req, &out, &errb)
	if res != nil {
		res.Stdout, res.Stderr = out.Bytes(), errb.Bytes()
	}
	return res, err
}

// ExecStream runs a command like Exec but hands its output to stdout and
// stderr (either may be nil to discard) in chunks while the command runs.
// The writers are called outside the per-VM lock, from the calling
// goroutine. The output goes to guest files, not to the agent's memory,
// and is read incrementally, so a command printing gigabytes costs the
// agent nothing and the client only the limit; a background child that
// keeps stdout open does not delay the result, which comes when the
// command itself exits. When ctx ends, the command's process group and
// session are killed and the context's error is returned.
func (a *Agent) ExecStream(ctx context.Context, req ExecRequest, stdout, stderr io.Writer) (*ExecResult, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	limit := req.OutputLimit
	if limit == 0 {
		limit = a.c.opts.OutputLimit
	}
	base := path.Join(a.c.opts.GuestTempDir, ".pve-inspect-"+randomTag())
	outPath, errPath, inPath := base+".out", base+".err", ""

	var inline []byte
	bigStdin := false
	if req.Stdin != nil {
		buf := make([]byte, a.c.opts.InlineStdin+1)
		n, err := io.ReadFull(req.Stdin, buf)
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			inline = buf[:n]
		case err != nil:
			return nil, fmt.Errorf("qga exec: read stdin: %w", err)
		default:
			inline, bigStdin = buf, true
			inPath = base + ".in"
		}
	}

	so := &outStream{h: -1, w: stdout, limit: limit}
	se := &outStream{h: -1, w: stderr, limit: limit}
	started := false
	defer func() {
		a.closeHandles(ctx, so.h, se.h)
		if !started {
			a.removeGuestFiles(ctx, outPath, errPath, inPath)
		}
	}()
	if bigStdin {
		hIn := int64(-1)
		err := a.withTempDir(ctx, func() error {
			return a.session(ctx, func(cn *conn) (err error) {
				hIn, err = cn.fileOpen(inPath, "w")
				return err
			})
		})
		if err == nil {
			_, err = a.writeHandle(ctx, hIn, inline, req.Stdin)
			if cerr := a.closeHandles(ctx, hIn); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return nil, fmt.Errorf("qga exec: upload stdin: %w", err)
		}
		inline = nil
	}

	// One session creates the output files and starts the wrapper.
	sc := wrapper(&req, outPath, errPath, inPath, inline != nil)
	argv := append([]string{"/bin/sh", "-c", strings.Join(sc.lines, "\n"), "pve-inspect-exec"}, sc.args...)
	res := &ExecResult{}
	err := a.withTempDir(ctx, func() error {
		return a.session(ctx, func(cn *conn) error {
			h, err := cn.fileOpen(outPath, "w+")
			if err != nil {
				return fmt.Errorf("create output file: %w", err)
			}
			so.h = h
			if h, err = cn.fileOpen(errPath, "w+"); err != nil {
				return fmt.Errorf("create output file: %w", err)
			}
			se.h = h
			if res.PID, err = cn.execStart(argv, inline, false); err != nil {
				return fmt.Errorf("start: %w", err)
			}
			started = true
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("qga exec: %w", err)
	}
	start := time.Now()

	p := newPoller()
	killed := false
	var firstKill, lastKill time.Time
	k := a.newChunker(a.maxReadChunk())
	exited := false
	lastRead := start
	for {
		if ctx.Err() != nil {
			return nil, a.abandon(ctx, res.PID)
		}
		// One session: status (until it exited); once it exited, or when
		// outputEvery passed since the last read, one chunk of each stream;
		// once both are drained, closing the handles. While a quick command
		// runs, a poll is a single agent call.
		var outData, errData []byte
		t0 := time.Now()
		err := a.session(ctx, func(cn *conn) (err error) {
			if !exited {
				st, err := cn.execStatus(res.PID, 0) // no capture: no data
				if err != nil {
					return err
				}
				if st.Exited {
					st.outcome(res)
					exited = true
				}
			}
			if !exited && time.Since(lastRead) < outputEvery {
				return nil
			}
			lastRead = time.Now()
			if outData, err = so.take(cn, k.size, exited); err != nil {
				return err
			}
			if errData, err = se.take(cn, k.size, exited); err != nil {
				return err
			}
			if so.done && se.done {
				for _, s := range []*outStream{so, se} {
					if err := cn.fileClose(s.h); err != nil {
						return err
					}
					s.h = -1
				}
			}
			return nil
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil, a.abandon(ctx, res.PID)
			}
			return nil, fmt.Errorf("qga exec: poll: %w", err)
		}
		k.observe(max(len(outData), len(errData)), time.Since(t0))
		if err := so.deliver(outData); err != nil {
			a.abandon(ctx, res.PID)
			return nil, fmt.Errorf("qga exec: stdout: %w", err)
		}
		if err := se.deliver(errData); err != nil {
			a.abandon(ctx, res.PID)
			return nil, fmt.Errorf("qga exec: stderr: %w", err)
		}
		if exited && so.done && se.done {
			break
		}
		// The kill follows a status that found the command running: one
		// that ended between the last poll and its deadline is not
		// reported as timed out.
		if !exited && req.Timeout > 0 && time.Since(start) >= req.Timeout && time.Since(lastKill) > 500*time.Millisecond {
			// Repeat the kill while the command lives: it may not have
			// become a group leader yet the first time.
			if err := a.killGroup(ctx, res.PID); err != nil {
				if ctx.Err() != nil {
					return nil, a.abandon(ctx, res.PID)
				}
				return nil, fmt.Errorf("qga exec: kill after timeout: %w", err)
			}
			if !killed {
				firstKill = time.Now()
			}
			killed, lastKill = true, time.Now()
		}
		if killed && !exited && time.Since(firstKill) > killGrace {
			return nil, fmt.Errorf("qga exec: pid %d still running %v after SIGKILL", res.PID, killGrace)
		}
		if !exited {
			if err := sleepCtx(ctx, p.next()); err != nil {
				return nil, a.abandon(ctx, res.PID)
			}
		}
	}
	res.TimedOut = killed
	res.StdoutBytes, res.StderrBytes = so.n, se.n
	res.StdoutTruncated, res.StderrTruncated = so.truncated, se.truncated
	return res, nil
}

func (s *outStream) deliver(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	n, err := s.w.Write(data)
	s.n += int64(n)
	return err
}

// abandon kills the command (the caller gave up) on a fresh short context,
// waits briefly for it to be reaped so the agent forgets it, and returns
// the context's error.
func (a *Agent) abandon(ctx context.Context, pid int) error {
	return a.abandonWith(ctx, pid, a.killGroup)
}

// abandonWith is abandon with the given way of killing the command.
func (a *Agent) abandonWith(ctx context.Context, pid int, kill func(context.Context, int) error) error {
	cause := ctx.Err()
	if cause == nil {
		cause = errors.New("abandoned")
	}
	fresh, cancel := context.WithTimeout(context.WithoutCancel(ctx), handleCloseTimeout)
	defer cancel()
	if err := kill(fresh, pid); err == nil {
		p := newPoller()
		for fresh.Err() == nil {
			var st *guestExec
			err := a.session(fresh, func(cn *conn) (err error) {
				st, err = cn.execStatus(pid, 0) // the output is not wanted
				return err
			})
			if err != nil || st.Exited {
				break
			}
			sleepCtx(fresh, p.next())
		}
	}
	return fmt.Errorf("qga exec: %w", cause)
}

// randomTag is a fresh name part for guest temp files.
func randomTag() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// RunProgram uploads program (for example a static probe binary) to a
// fresh executable file in the guest, runs it like Exec
// with req's settings and removes it afterwards. req.Argv holds only the
// program's arguments; the uploaded file is argv[0]. The temp directory
// (Options.GuestTempDir) must not be mounted noexec.
func (a *Agent) RunProgram(ctx context.Context, program io.Reader, req ExecRequest) (*ExecResult, error) {
	p := path.Join(a.c.opts.GuestProgramDir, ".pve-inspect-"+randomTag()+".bin")
	req.Argv = append([]string{p}, req.Argv...)
	if err := req.validate(); err != nil {
		return nil, err
	}
	defer a.removeGuestFiles(ctx, p)
	if err := a.WriteFile(ctx, p, program, 0o755); err != nil {
		return nil, fmt.Errorf("qga run program: upload: %w", err)
	}
	return a.Exec(ctx, req)
}

// withTempDir runs fn and, if it failed because the guest temp directory
// is missing (first use after the guest booted), creates the directory
// (mode 0700: exec output must not be readable by the guest's other
// users) and runs fn once more.
func (a *Agent) withTempDir(ctx context.Context, fn func() error) error {
	err := fn()
	if !errors.Is(err, ErrNotFound) {
		return err
	}
	res, rerr := a.run(ctx, []string{"/bin/mkdir", "-p", "-m", "0700", "--", a.c.opts.GuestTempDir})
	if rerr != nil {
		return fmt.Errorf("create guest temp dir: %w", rerr)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("create guest temp dir %s: %w", a.c.opts.GuestTempDir, res.err())
	}
	return fn()
}
