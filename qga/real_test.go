package qga

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// guestHasNo reports whether no process named name runs in the guest.
//
// The kill is sent before the exec answers, but a killed process is gone
// from /proc only once the guest's init has reaped it, which on a loaded
// machine may take a moment: pgrep is asked again for up to a minute (a
// survivor of SIGKILL is still there then, so this cannot hide one).
func guestHasNo(t testing.TB, a *Agent, name string) bool {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		res, err := a.Exec(testCtx(t, time.Minute), ExecRequest{Argv: []string{"pgrep", "-x", name}})
		if err != nil {
			t.Fatalf("pgrep: %v", err)
		}
		if res.ExitCode > 1 {
			t.Fatalf("pgrep failed: %+v %s", res, res.Stderr)
		}
		if res.ExitCode == 1 || time.Now().After(deadline) {
			return res.ExitCode == 1
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// guestTempEmpty asserts that the client left no temp files in dir (the
// listing command's own are unlinked before it starts; a directory that
// was never created is empty).
func guestTempEmpty(t testing.TB, a *Agent, dir string) {
	t.Helper()
	res, err := a.Exec(testCtx(t, 30*time.Second), ExecRequest{Argv: []string{"sh", "-c", `[ -e "$1" ] || { echo 0; exit 0; }; l=$(ls -A "$1") || exit 9; printf '%s\n' "$l" | grep -c '^\.pve-inspect-'`, "ls", dir}})
	if err != nil || res.ExitCode == 9 {
		t.Fatalf("ls %s: %v %s", dir, err, res.Stderr)
	}
	if got := strings.TrimSpace(string(res.Stdout)); got != "0" {
		t.Fatalf("guest temp dir %s holds %s pve-inspect files", dir, got)
	}
}

// execPath is one way a collected exec can go.
type execPath struct {
	name string
	exec func(context.Context, ExecRequest) (*ExecResult, error)
}

// execPaths are the collected paths for requests that could take any:
// the direct one (what Exec picks: tagged when the agent's environment is
// known), the direct one through setsid (its fallback) and the wrapper's.
func execPaths(a *Agent) []execPath {
	return []execPath{
		{"direct", func(ctx context.Context, r ExecRequest) (*ExecResult, error) {
			if _, ok := a.fastPlan(&r); !ok || !directPlan(&r) {
				return nil, fmt.Errorf("request %+v does not take the direct path", r)
			}
			return a.Exec(ctx, r)
		}},
		{"setsid", func(ctx context.Context, r ExecRequest) (*ExecResult, error) {
			limit, ok := a.fastPlan(&r)
			if !ok || !directPlan(&r) {
				return nil, fmt.Errorf("request %+v does not take the direct path", r)
			}
			return a.execCaptured(ctx, &r, limit, a.setsidRun(&r))
		}},
		{"wrapper", func(ctx context.Context, r ExecRequest) (*ExecResult, error) {
			limit, ok := a.fastPlan(&r)
			if !ok {
				return nil, fmt.Errorf("request %+v does not take a collected path", r)
			}
			return a.execFast(ctx, &r, limit)
		}},
	}
}

func TestExecExitCodes(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	if err := a.WriteFile(testCtx(t, time.Minute), g.Dir+"/not-executable", strings.NewReader("echo hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		argv   []string
		code   int
		signal int
		stderr string
	}{
		{"true", []string{"true"}, 0, 0, ""},
		{"false", []string{"false"}, 1, 0, ""},
		{"exit 42", []string{"sh", "-c", "exit 42"}, 42, 0, ""},
		{"missing program", []string{"/no/such/program"}, 127, 0, "No such file"},
		{"missing program in PATH", []string{"no-such-program-pvei"}, 127, 0, "no-such-program-pvei"},
		{"not executable", []string{g.Dir + "/not-executable"}, 126, 0, "Permission denied"},
		{"sigkill", []string{"sh", "-c", "kill -9 $$"}, 137, 9, ""},
		{"sigterm", []string{"sh", "-c", "kill -15 $$"}, 143, 15, ""},
	}
	for _, path := range execPaths(a) {
		for _, tt := range tests {
			t.Run(path.name+"/"+tt.name, func(t *testing.T) {
				res, err := path.exec(testCtx(t, time.Minute), ExecRequest{Argv: tt.argv})
				if err != nil {
					t.Fatal(err)
				}
				if res.ExitCode != tt.code || res.Signal != tt.signal || res.TimedOut {
					t.Fatalf("got exit %d signal %d timedout %v, want %d %d (stderr %q)", res.ExitCode, res.Signal, res.TimedOut, tt.code, tt.signal, res.Stderr)
				}
				if !bytes.Contains(res.Stderr, []byte(tt.stderr)) {
					t.Fatalf("stderr %q does not mention %q", res.Stderr, tt.stderr)
				}
			})
		}
	}
	guestTempEmpty(t, a, a.c.opts.GuestTempDir)
}

func TestExecBytesEnvCwdUser(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	tests := []struct {
		name         string
		req          ExecRequest
		code         int
		stdout       string
		stderrSubstr string
	}{
		{name: "utf-8 argv and output", req: ExecRequest{Argv: []string{"printf", "%s", "héllo wörld ✓ 日本語 \"'$x`;"}}, stdout: "héllo wörld ✓ 日本語 \"'$x`;"},
		{name: "invalid utf-8 argv", req: ExecRequest{Argv: []string{"printf", "%s", "\xff\xfe a\x80b\n\n"}}, stdout: "\xff\xfe a\x80b\n\n"},
		{name: "binary output", req: ExecRequest{Argv: []string{"printf", `\377\000\001\n`}}, stdout: "\xff\x00\x01\n"},
		{name: "many args", req: ExecRequest{Argv: append([]string{"printf", "%s,"}, strings.Split("a b c d e f g h i j k l", " ")...)}, stdout: "a,b,c,d,e,f,g,h,i,j,k,l,"},
		{name: "empty arg", req: ExecRequest{Argv: []string{"printf", "[%s]", ""}}, stdout: "[]"},
		{name: "env", req: ExecRequest{Argv: []string{"sh", "-c", `printf '%s|%s' "$FOO" "$BAR"`}, Env: map[string]string{"FOO": "a b\nc", "BAR": "\xff"}}, stdout: "a b\nc|\xff"},
		{name: "env overrides PATH", req: ExecRequest{Argv: []string{"sh", "-c", `printf %s "$PATH"`}, Env: map[string]string{"PATH": "/bin:/usr/bin"}}, stdout: "/bin:/usr/bin"},
		{name: "cwd", req: ExecRequest{Argv: []string{"pwd"}, Cwd: "/usr/share"}, stdout: "/usr/share\n"},
		{name: "missing cwd", req: ExecRequest{Argv: []string{"pwd"}, Cwd: "/no/such/dir"}, code: ExitSetupFailed, stderrSubstr: "working directory"},
		{name: "user", req: ExecRequest{Argv: []string{"sh", "-c", `echo $(id -u) $(id -g) $HOME`}, User: "nobody"}, stdout: "65534 65534 /nonexistent\n"},
		{name: "missing user", req: ExecRequest{Argv: []string{"id"}, User: "no-such-user-pvei"}, code: ExitSetupFailed, stderrSubstr: "no such user"},
		{name: "small stdin", req: ExecRequest{Argv: []string{"cat"}, Stdin: strings.NewReader("to cat\n")}, stdout: "to cat\n"},
		{name: "empty stdin", req: ExecRequest{Argv: []string{"cat"}, Stdin: strings.NewReader("")}, stdout: ""},
		{name: "no stdin is /dev/null", req: ExecRequest{Argv: []string{"cat"}}, stdout: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := a.Exec(testCtx(t, time.Minute), tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tt.code {
				t.Fatalf("exit %d, want %d (stderr %q)", res.ExitCode, tt.code, res.Stderr)
			}
			if tt.code == 0 && string(res.Stdout) != tt.stdout {
				t.Fatalf("stdout %q, want %q (stderr %q)", res.Stdout, tt.stdout, res.Stderr)
			}
			if !bytes.Contains(res.Stderr, []byte(tt.stderrSubstr)) {
				t.Fatalf("stderr %q does not mention %q", res.Stderr, tt.stderrSubstr)
			}
		})
	}
}

func TestExecLargeStdin(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	in := make([]byte, 32<<20)
	rand.Read(in)
	res, err := a.Exec(testCtx(t, 5*time.Minute), ExecRequest{Argv: []string{"cat"}, Stdin: bytes.NewReader(in), OutputLimit: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.StdoutTruncated || sha256.Sum256(res.Stdout) != sha256.Sum256(in) {
		t.Fatalf("cat of 32 MiB: exit %d, %d bytes back, truncated %v, stderr %q", res.ExitCode, len(res.Stdout), res.StdoutTruncated, res.Stderr)
	}
	guestTempEmpty(t, a, a.c.opts.GuestTempDir)
}

func TestExecOutputCap(t *testing.T) {
	g := startGuest(t)
	c := New(Options{})
	a := c.Agent(g.Socket)
	res, err := a.Exec(testCtx(t, 5*time.Minute), ExecRequest{Argv: []string{"sh", "-c", "head -c 104857600 /dev/urandom; echo done >&2"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || !res.StdoutTruncated || len(res.Stdout) != DefaultOutputLimit || res.StdoutBytes != DefaultOutputLimit {
		t.Fatalf("exit %d, %d bytes, truncated %v", res.ExitCode, len(res.Stdout), res.StdoutTruncated)
	}
	if res.StderrTruncated || string(res.Stderr) != "done\n" {
		t.Fatalf("stderr %q truncated %v", res.Stderr, res.StderrTruncated)
	}
	// The client never buffered more than one reply's worth (on the direct
	// path: what the agent captures of both streams).
	if p, bound := c.PeakBufferedBytes(), int64(directReplyBound+readSize); p > bound {
		t.Fatalf("peak buffered %d > %d", p, bound)
	}
	// A small explicit limit cuts exactly.
	res, err = a.Exec(testCtx(t, time.Minute), ExecRequest{Argv: []string{"printf", "0123456789"}, OutputLimit: 4})
	if err != nil || string(res.Stdout) != "0123" || !res.StdoutTruncated {
		t.Fatalf("limit 4: %q truncated %v err %v", res.Stdout, res.StdoutTruncated, err)
	}
	res, err = a.Exec(testCtx(t, time.Minute), ExecRequest{Argv: []string{"printf", "0123"}, OutputLimit: 4})
	if err != nil || string(res.Stdout) != "0123" || res.StdoutTruncated {
		t.Fatalf("exactly the limit: %q truncated %v err %v", res.Stdout, res.StdoutTruncated, err)
	}
}

// TestExecCapsBothPaths: each stream is cut at the limit and flagged, on
// the direct path (the agent's capture, cut by the client; past the
// agent's own 16 MiB cap its flag) and on the wrapper's.
func TestExecCapsBothPaths(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	tests := []struct {
		name               string
		script             string
		limit              int64
		outLen, errLen     int
		outTrunc, errTrunc bool
	}{
		{"stderr over the limit", "printf 0123456789 >&2; printf ab", 4, 2, 4, false, true},
		{"binary stdout over the limit", `printf '\377\000\001\200xyz'`, 4, 4, 0, true, false},
		{"both under", "printf abc; printf de >&2", 4, 3, 2, false, false},
		{"past the agent's cap", "head -c 17000000 /dev/zero", agentOutputCap - 1, agentOutputCap - 1, 0, true, false},
	}
	for _, path := range execPaths(a) {
		for _, tt := range tests {
			t.Run(path.name+"/"+tt.name, func(t *testing.T) {
				res, err := path.exec(testCtx(t, 2*time.Minute), ExecRequest{Argv: []string{"sh", "-c", tt.script}, OutputLimit: tt.limit})
				if err != nil {
					t.Fatal(err)
				}
				if res.ExitCode != 0 || len(res.Stdout) != tt.outLen || len(res.Stderr) != tt.errLen ||
					res.StdoutTruncated != tt.outTrunc || res.StderrTruncated != tt.errTrunc ||
					res.StdoutBytes != int64(tt.outLen) || res.StderrBytes != int64(tt.errLen) {
					t.Fatalf("exit %d, stdout %d bytes (truncated %v), stderr %q (truncated %v)", res.ExitCode, len(res.Stdout), res.StdoutTruncated, res.Stderr, res.StderrTruncated)
				}
				if tt.name == "binary stdout over the limit" && string(res.Stdout) != "\xff\x00\x01\x80" {
					t.Fatalf("stdout %q", res.Stdout)
				}
			})
		}
	}
}

func TestExecTimeoutKillsTree(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	// Background children, a subshell's child, and an orphan that left
	// the tree (its parent exited) with its output redirected: the
	// session and group kill gets them all.
	script := "sleep 600 & sleep 600 & (sleep 600; echo never) & (sleep 600 >/dev/null 2>&1 &); sleep 600"
	for _, path := range execPaths(a) {
		t.Run(path.name, func(t *testing.T) {
			start := time.Now()
			res, err := path.exec(testCtx(t, time.Minute), ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			t.Logf("timed out after %v", took)
			if !res.TimedOut || res.Signal != 9 || res.ExitCode != 137 || took > 10*time.Second {
				t.Fatalf("got %+v after %v, want timed out with SIGKILL", res, took)
			}
			if !guestHasNo(t, a, "sleep") {
				t.Fatal("sleep processes survived the timeout")
			}
		})
	}
}

// guestAlive reports whether the guest process pid exists.
func guestAlive(t testing.TB, a *Agent, pid string) bool {
	t.Helper()
	res, err := a.Exec(testCtx(t, 30*time.Second), ExecRequest{Argv: []string{"kill", "-0", pid}})
	if err != nil {
		t.Fatalf("kill -0 %s: %v", pid, err)
	}
	return res.ExitCode == 0
}

// killGuestPid kills a process the test started in the guest, by its pid.
func killGuestPid(t testing.TB, a *Agent, pid string) {
	res, err := a.Exec(testCtx(t, 30*time.Second), ExecRequest{Argv: []string{"kill", "-9", pid}})
	if err != nil || (res.ExitCode != 0 && guestAlive(t, a, pid)) {
		t.Errorf("kill guest pid %s: %v %+v", pid, err, res)
	}
}

// TestExecBackgroundChild: a background child that keeps the output open
// does not hold the result. On the direct path it is killed once the
// command is gone (the agent reports the exit only when the pipes close);
// one that redirected its output keeps running. The wrapper paths leave
// both running.
func TestExecBackgroundChild(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	tests := []struct {
		name     string
		path     int // index in execPaths
		redirect bool
		survives bool
	}{
		{"direct, holds stdout", 0, false, false},
		{"direct, output redirected", 0, true, true},
		{"wrapper, holds stdout", 2, false, true},
		{"setsid, holds stdout", 1, false, false},
		{"setsid, output redirected", 1, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bg := "sleep 600 &"
			if tt.redirect {
				bg = "sleep 600 >/dev/null 2>&1 &"
			}
			start := time.Now()
			res, err := execPaths(a)[tt.path].exec(testCtx(t, time.Minute), ExecRequest{
				Argv:    []string{"sh", "-c", bg + ` echo "$!"; echo started >&2; exit 3`},
				Timeout: 30 * time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			pid := strings.TrimSpace(string(res.Stdout))
			if pid != "" {
				t.Cleanup(func() {
					if guestAlive(t, a, pid) {
						killGuestPid(t, a, pid)
					}
				})
			}
			took := time.Since(start)
			t.Logf("result after %v", took)
			if res.TimedOut || res.ExitCode != 3 || string(res.Stderr) != "started\n" || pid == "" || took > 10*time.Second {
				t.Fatalf("got %+v stdout %q stderr %q after %v, want a prompt exit 3", res, res.Stdout, res.Stderr, took)
			}
			if alive := guestAlive(t, a, pid); alive != tt.survives {
				t.Fatalf("background child alive %v, want %v", alive, tt.survives)
			}
		})
	}
}

func TestExecCancelKills(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(time.Second, cancel)
	_, err := a.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "sleep 600 & sleep 600"}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if !guestHasNo(t, a, "sleep") {
		t.Fatal("sleep survived the cancellation")
	}
	guestTempEmpty(t, a, a.c.opts.GuestTempDir)
}

// chunkRecorder counts the chunks a stream delivers and whether one came
// before the command said it was done.
type chunkRecorder struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes int
}

func (r *chunkRecorder) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes++
	return r.buf.Write(b)
}

func TestExecStreamDeliversWhileRunning(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	var out, errw chunkRecorder
	// The command waits for a marker file that the test creates only after
	// it has received the first chunk: it can only finish if streaming works.
	marker := g.Dir + "/go-on"
	got := make(chan struct{})
	w := writerFunc(func(b []byte) (int, error) {
		n, err := out.Write(b)
		if bytes.Contains(out.buf.Bytes(), []byte("first")) {
			select {
			case <-got:
			default:
				close(got)
			}
		}
		return n, err
	})
	go func() {
		select {
		case <-got:
			a.WriteFile(context.Background(), marker, strings.NewReader(""), 0o644)
		case <-time.After(time.Minute):
		}
	}()
	res, err := a.ExecStream(testCtx(t, 2*time.Minute), ExecRequest{
		Argv:    []string{"sh", "-c", `echo first; echo e >&2; while [ ! -e "$1" ]; do sleep 0.05; done; echo second`, "x", marker},
		Timeout: 30 * time.Second,
	}, w, &errw)
	if err != nil {
		t.Fatal(err)
	}
	if res.TimedOut || res.ExitCode != 0 || out.buf.String() != "first\nsecond\n" || errw.buf.String() != "e\n" {
		t.Fatalf("got %+v stdout %q stderr %q", res, out.buf.String(), errw.buf.String())
	}
	if out.writes < 2 {
		t.Fatalf("stdout came in %d writes, want streaming chunks", out.writes)
	}
	if res.Stdout != nil {
		t.Fatal("ExecStream must not also collect output")
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func sha(b []byte) string { return fmt.Sprintf("%x", sha256.Sum256(b)) }

func TestFileRoundTrip(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	big := make([]byte, 5<<20+7)
	rand.Read(big)
	tests := []struct {
		name string
		path string
		data []byte
		mode uint32
	}{
		{"empty", g.Dir + "/empty", nil, 0o644},
		{"one byte", g.Dir + "/one", []byte{0xFF}, 0o600},
		{"missing dirs", g.Dir + "/new/sub/dir/file", []byte("nested\n"), 0o755},
		{"non-ascii name", g.Dir + "/fïlé ✓", []byte("x"), 0o644},
		{"multi chunk", g.Dir + "/big", big, 0o640},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testCtx(t, 5*time.Minute)
			if err := a.WriteFile(ctx, tt.path, bytes.NewReader(tt.data), 0o777&fsMode(tt.mode)); err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			n, err := a.ReadFile(ctx, tt.path, &got, 0)
			if err != nil {
				t.Fatal(err)
			}
			if n != int64(len(tt.data)) || sha(got.Bytes()) != sha(tt.data) {
				t.Fatalf("read back %d bytes, wrote %d (or content differs)", n, len(tt.data))
			}
			res, err := a.Exec(ctx, ExecRequest{Argv: []string{"stat", "-c", "%a", tt.path}})
			if err != nil || strings.TrimSpace(string(res.Stdout)) != fmt.Sprintf("%o", tt.mode) {
				t.Fatalf("mode %q, want %o (%v)", res.Stdout, tt.mode, err)
			}
		})
	}
	ctx := testCtx(t, time.Minute)
	t.Run("overwrite is atomic replace", func(t *testing.T) {
		p := g.Dir + "/over"
		for _, s := range []string{"first version, longer", "second"} {
			if err := a.WriteFile(ctx, p, strings.NewReader(s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		var got bytes.Buffer
		if _, err := a.ReadFile(ctx, p, &got, 0); err != nil || got.String() != "second" {
			t.Fatalf("got %q, %v", got.String(), err)
		}
		guestTempEmpty(t, a, g.Dir)
	})
	t.Run("read errors", func(t *testing.T) {
		for _, c := range []struct {
			path string
			want error
		}{
			{g.Dir + "/missing", ErrNotFound},
			{g.Dir + "/missing/dir/file", ErrNotFound},
			{g.Dir + "/one/below-a-file", ErrNotFound},
			{g.Dir, ErrIsDir},
			// The bed's guests run without CAP_SYSLOG: even root gets EPERM.
			{"/proc/kmsg", ErrPermission},
		} {
			if _, err := a.ReadFile(ctx, c.path, discard{}, 0); !errors.Is(err, c.want) {
				t.Errorf("ReadFile(%s): got %v, want %v", c.path, err, c.want)
			}
		}
	})
	t.Run("limit", func(t *testing.T) {
		var got bytes.Buffer
		n, err := a.ReadFile(ctx, g.Dir+"/big", &got, 1000)
		if !errors.Is(err, ErrTooLarge) || n != 1000 || !bytes.Equal(got.Bytes(), big[:1000]) {
			t.Fatalf("got %d bytes, %v; want 1000 and ErrTooLarge", n, err)
		}
		got.Reset()
		if n, err := a.ReadFile(ctx, g.Dir+"/one", &got, 1); err != nil || n != 1 {
			t.Fatalf("file exactly at the limit: %d, %v", n, err)
		}
	})
	t.Run("write onto a directory", func(t *testing.T) {
		err := a.WriteFile(ctx, g.Dir+"/new", strings.NewReader("x"), 0o644)
		if !errors.Is(err, ErrIsDir) {
			t.Fatalf("got %v, want ErrIsDir", err)
		}
		guestTempEmpty(t, a, g.Dir)
	})
	t.Run("write below a file", func(t *testing.T) {
		err := a.WriteFile(ctx, g.Dir+"/one/x", strings.NewReader("x"), 0o644)
		if err == nil {
			t.Fatal("writing below a regular file succeeded")
		}
	})
	t.Run("cancelled write leaves nothing", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		r := &cancelAfter{r: bytes.NewReader(big), n: 2 << 20, cancel: cancel}
		err := a.WriteFile(cctx, g.Dir+"/cancelled", r, 0o644)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
		if _, err := a.ReadFile(ctx, g.Dir+"/cancelled", discard{}, 0); !errors.Is(err, ErrNotFound) {
			t.Fatalf("destination after cancelled write: %v", err)
		}
		guestTempEmpty(t, a, g.Dir)
	})
}

// cancelAfter cancels its context once n bytes were read from it.
type cancelAfter struct {
	r      io.Reader
	n      int
	cancel func()
}

func (c *cancelAfter) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n -= n
	if c.n <= 0 {
		c.cancel()
	}
	return n, err
}

func fsMode(m uint32) fs.FileMode { return fs.FileMode(m) }

// TestFile512MiB: a 512 MiB random file written and read back is
// byte-identical. Streams both ways; slow on a loaded machine (skipped with
// -short).
func TestFile512MiB(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED under -short: 512 MiB round trip")
	}
	g := startGuest(t)
	c := New(Options{})
	a := c.Agent(g.Socket)
	const size = 512 << 20
	ctx := testCtx(t, 30*time.Minute)
	src := io.LimitReader(mrand.NewChaCha8([32]byte{1, 2, 3}), size)
	wsum := sha256.New()
	start := time.Now()
	if err := a.WriteFile(ctx, g.Dir+"/512m", io.TeeReader(src, wsum), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("write: %v", time.Since(start))
	start = time.Now()
	rsum := sha256.New()
	n, err := a.ReadFile(ctx, g.Dir+"/512m", rsum, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("read: %v", time.Since(start))
	if n != size || !bytes.Equal(wsum.Sum(nil), rsum.Sum(nil)) {
		t.Fatalf("read %d bytes, sha256 %x, wrote %x", n, rsum.Sum(nil), wsum.Sum(nil))
	}
	if p, bound := c.PeakBufferedBytes(), int64(c.Options().MaxReplyBytes+readSize); p > bound {
		t.Fatalf("peak buffered %d > %d", p, bound)
	}
}

func TestRunProgram(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	ctx := testCtx(t, 2*time.Minute)
	prog := "#!/bin/sh\necho \"probe $# $1\"\nexit 7\n"
	res, err := a.RunProgram(ctx, strings.NewReader(prog), ExecRequest{Argv: []string{"arg one"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 7 || string(res.Stdout) != "probe 1 arg one\n" {
		t.Fatalf("got exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	guestTempEmpty(t, a, a.c.opts.GuestTempDir)
	guestTempEmpty(t, a, a.c.opts.GuestProgramDir)
	// The temp dir is created 0700 by the first request that needs it
	// (the direct path does not: cwd takes the wrapper).
	if res, err := a.Exec(ctx, ExecRequest{Argv: []string{"true"}, Cwd: "/"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec through the wrapper: %+v %v", res, err)
	}
	res, err = a.Exec(ctx, ExecRequest{Argv: []string{"stat", "-c", "%a %U", a.c.opts.GuestTempDir}})
	if err != nil || string(res.Stdout) != "700 root\n" {
		t.Fatalf("guest temp dir: %q %v", res.Stdout, err)
	}
}
