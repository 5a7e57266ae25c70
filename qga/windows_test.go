package qga_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/qga/wintest"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// No Windows guest exists on the build machine: these tests run the
// Windows guest against wintest's fake of qemu-ga's Windows build.

func newWinGuest(t *testing.T, o qga.Options) (*wintest.Agent, sandbox.Guest, *qga.Client) {
	t.Helper()
	f := wintest.New(t)
	c := qga.New(o)
	return f, c.WindowsGuests()(f.Socket), c
}

func winCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// tricky arguments: spaces, quotes, backslashes before quotes and at the
// end, an empty one, cmd.exe's operators and percent signs
var trickyArgs = []string{"a b", `quote"d`, `back\`, `two\\"q`, "", `tab	x`, `& | < > ^ %PATH% !x!`, `C:\Program Files\x\`}

func TestWinExec(t *testing.T) {
	argvOut := strings.Join(trickyArgs, "\r\n") + "\r\n"
	tests := []struct {
		name       string
		req        sandbox.GuestExec
		code       int
		stdout     string
		stderrHas  string
		script     bool   // ran through a batch file
		cwdVar     string // PVE_INSPECT_CWD of the exec
		truncated  bool
		timedOut   bool
		wantErr    error
		errHas     string
		envHas     []string
		envHasNone []string
	}{
		{name: "argv through guest-exec", req: sandbox.GuestExec{Argv: append([]string{"echo.exe"}, trickyArgs...)}, stdout: argvOut},
		{name: "argv with cwd: the command line splits back", req: sandbox.GuestExec{Argv: append([]string{"echo.exe"}, trickyArgs...), Cwd: `C:/Users/`},
			stdout: argvOut, script: true, cwdVar: `C:\Users`},
		{name: "cwd", req: sandbox.GuestExec{Argv: []string{"pwd.exe"}, Cwd: `c:\windows\TEMP`}, stdout: "C:\\windows\\TEMP\r\n", script: true, cwdVar: `C:\windows\TEMP`},
		{name: "missing cwd", req: sandbox.GuestExec{Argv: []string{"pwd.exe"}, Cwd: `C:\nowhere`}, code: 125, stderrHas: "cannot find the path", script: true},
		{name: "shell string", req: sandbox.GuestExec{Argv: []string{"cmd.exe", "/c", "echo \"a & b\" %PATH%\necho two\r\nexit /b 3"}},
			code: 3, stdout: "\"a & b\" %PATH%\r\ntwo\r\n", script: true},
		{name: "shell string, cmd by path, /C, in cwd", req: sandbox.GuestExec{Argv: []string{`C:\Windows\System32\CMD.EXE`, "/C", "pwd.exe"}, Cwd: `C:\Users`},
			stdout: "C:\\Users\r\n", script: true, cwdVar: `C:\Users`},
		{name: "shell string's exit code", req: sandbox.GuestExec{Argv: []string{"cmd", "/c", "nosuch"}}, code: 9009, stderrHas: "is not recognized", script: true},
		{name: "env on the base", req: sandbox.GuestExec{Argv: []string{"env.exe"}, Env: map[string]string{"FOO": "bar", "path": `D:\bin`}},
			envHas: []string{"FOO=bar", `path=D:\bin`, `SystemRoot=C:\Windows`, `TEMP=C:\Windows\Temp`}, envHasNone: []string{`PATH=C:\Windows`, "HOME=", "/usr"}},
		{name: "env of a batch exec", req: sandbox.GuestExec{Argv: []string{"env.exe"}, Env: map[string]string{"FOO": "bar"}, Cwd: `C:\Users`},
			script: true, cwdVar: `C:\Users`, envHas: []string{"FOO=bar", `ComSpec=C:\Windows\System32\cmd.exe`}},
		{name: "stdin", req: sandbox.GuestExec{Argv: []string{"cat.exe"}, Stdin: []byte("hello\x00there")}, stdout: "hello\x00there"},
		{name: "output limit", req: sandbox.GuestExec{Argv: []string{"big.exe", "5000"}, OutputLimit: 1000}, stdout: strings.Repeat("o", 1000), truncated: true},
		{name: "NTSTATUS exit", req: sandbox.GuestExec{Argv: []string{"exit.exe", "0xC0000005"}}, code: 0xC0000005},
		{name: "plain exit code", req: sandbox.GuestExec{Argv: []string{"exit.exe", "42"}}, code: 42},
		{name: "program not found", req: sandbox.GuestExec{Argv: []string{"nosuch.exe"}}, code: 127, stderrHas: "could not start nosuch.exe"},
		{name: "timeout kills the tree", req: sandbox.GuestExec{Argv: []string{"sleep.exe"}, Timeout: 1}, code: 1, timedOut: true},
		{name: "timeout of a shell string", req: sandbox.GuestExec{Argv: []string{"cmd.exe", "/c", "sleep.exe"}, Timeout: 1}, code: 1, timedOut: true, script: true},
		{name: "user refused", req: sandbox.GuestExec{Argv: []string{"echo.exe"}, User: "bob"}, wantErr: sandbox.ErrGuestInvalid, errHas: "user is not supported"},
		{name: "own env prefix refused", req: sandbox.GuestExec{Argv: []string{"echo.exe"}, Env: map[string]string{"pve_inspect_cwd": "x"}}, wantErr: sandbox.ErrGuestInvalid},
		{name: "relative cwd refused", req: sandbox.GuestExec{Argv: []string{"echo.exe"}, Cwd: `Users\x`}, wantErr: sandbox.ErrGuestInvalid},
		{name: "cwd with a quote refused", req: sandbox.GuestExec{Argv: []string{"echo.exe"}, Cwd: `C:\a" & calc & "`}, wantErr: sandbox.ErrGuestInvalid},
		{name: "an argv over cmd.exe's line with a cwd refused", req: sandbox.GuestExec{Argv: []string{"echo.exe", strings.Repeat("x", 8200)}, Cwd: `C:\Users`},
			wantErr: sandbox.ErrGuestInvalid, errHas: "8191"},
		{name: "a long argv without a cwd runs", req: sandbox.GuestExec{Argv: []string{"echo.exe", strings.Repeat("x", 9000)}}, stdout: strings.Repeat("x", 9000) + "\r\n"},
		{name: "non-UTF-8 argv refused", req: sandbox.GuestExec{Argv: []string{"echo.exe", "\xff"}}, wantErr: sandbox.ErrGuestInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, g, _ := newWinGuest(t, qga.Options{})
			res, err := g.Exec(winCtx(t), tc.req)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("err %v, want %v with %q", err, tc.wantErr, tc.errHas)
				}
				if n := len(f.Execs()); n != 0 {
					t.Fatalf("%d execs reached the guest", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tc.code || res.TimedOut != tc.timedOut || res.StdoutTruncated != tc.truncated {
				t.Errorf("exit %d timed out %v truncated %v, want %d %v %v (stderr %q)", res.ExitCode, res.TimedOut, res.StdoutTruncated, tc.code, tc.timedOut, tc.truncated, res.Stderr)
			}
			if tc.stdout != "" && string(res.Stdout) != tc.stdout {
				t.Errorf("stdout %q, want %q", res.Stdout, tc.stdout)
			}
			if !strings.Contains(string(res.Stderr), tc.stderrHas) {
				t.Errorf("stderr %q lacks %q", res.Stderr, tc.stderrHas)
			}
			for _, s := range tc.envHas {
				if !strings.Contains(string(res.Stdout), s+"\r\n") {
					t.Errorf("environment lacks %s:\n%s", s, res.Stdout)
				}
			}
			for _, s := range tc.envHasNone {
				if strings.Contains(string(res.Stdout), s) {
					t.Errorf("environment has %s:\n%s", s, res.Stdout)
				}
			}
			first := f.Execs()[0]
			if ran := first.Script != ""; ran != tc.script {
				t.Errorf("through a batch file %v, want %v (exec %+v)", ran, tc.script, first)
			}
			if tc.cwdVar != "" && first.Getenv("PVE_INSPECT_CWD") != tc.cwdVar {
				t.Errorf("PVE_INSPECT_CWD %q, want %q", first.Getenv("PVE_INSPECT_CWD"), tc.cwdVar)
			}
			if tc.timedOut && len(f.Killed()) == 0 {
				t.Error("timed out without a taskkill")
			}
			if f.Running() != 0 {
				t.Errorf("%d processes left running", f.Running())
			}
			if left := f.Files(); len(left) != 0 {
				t.Errorf("files left in the guest: %v", left)
			}
		})
	}
}

// TestWinExecScriptText: the batch files hold no request data but a
// shell string (the cwd and the command line travel in the environment).
func TestWinExecScriptText(t *testing.T) {
	f, g, _ := newWinGuest(t, qga.Options{})
	if _, err := g.Exec(winCtx(t), sandbox.GuestExec{Argv: []string{"echo.exe", "SECRET-ARG"}, Cwd: `C:\Users`}); err != nil {
		t.Fatal(err)
	}
	s := f.Execs()[0].Script
	if strings.Contains(s, "SECRET-ARG") || strings.Contains(s, `C:\Users`) || !strings.Contains(s, "!PVE_INSPECT_CMDLINE!") {
		t.Errorf("script:\n%s", s)
	}
	if _, err := g.Exec(winCtx(t), sandbox.GuestExec{Argv: []string{"cmd.exe", "/c", "echo a\necho b"}}); err != nil {
		t.Fatal(err)
	}
	if e := f.Execs()[2]; e.Script != "@echo off\r\ncall \"%PVE_INSPECT_SHELL%\"\r\nexit /b %errorlevel%\r\n" ||
		e.Body != "@echo off\r\necho a\r\necho b\r\n" {
		t.Errorf("shell script %q, its own batch file %q", e.Script, e.Body)
	}
}

// TestWinExecStream: ExecStream writes the collected output.
func TestWinExecStream(t *testing.T) {
	_, g, _ := newWinGuest(t, qga.Options{})
	var out, errb bytes.Buffer
	res, err := g.ExecStream(winCtx(t), sandbox.GuestExec{Argv: []string{"big.exe", "10"}}, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != strings.Repeat("o", 10) || errb.String() != strings.Repeat("e", 10) || res.ExitCode != 0 {
		t.Errorf("out %q err %q result %+v", out.String(), errb.String(), res)
	}
}

// TestWinAgentMisbehaves: malformed, oversize and flaky answers.
func TestWinAgentMisbehaves(t *testing.T) {
	tests := []struct {
		name    string
		faults  wintest.Faults
		req     sandbox.GuestExec
		wantErr error
		check   func(t *testing.T, res *apitype.ExecResult, c *qga.Client)
	}{
		{name: "status of the wrong shape", faults: wintest.Faults{StatusGarbage: true}, req: sandbox.GuestExec{Argv: []string{"echo.exe"}}, wantErr: sandbox.ErrGuestProtocol},
		{name: "output while running", faults: wintest.Faults{DataWhileRunning: true}, req: sandbox.GuestExec{Argv: []string{"sleep.exe"}, Timeout: 5}, wantErr: sandbox.ErrGuestProtocol},
		{name: "more output than asked is cut while read", faults: wintest.Faults{StatusOutput: bytes.Repeat([]byte("x"), 8<<20)},
			req: sandbox.GuestExec{Argv: []string{"echo.exe"}, OutputLimit: 1024}, check: func(t *testing.T, res *apitype.ExecResult, c *qga.Client) {
				if len(res.Stdout) != 1024 || !res.StdoutTruncated {
					t.Errorf("stdout %d bytes truncated %v", len(res.Stdout), res.StdoutTruncated)
				}
				if p := c.PeakBufferedBytes(); p > 1<<20 {
					t.Errorf("the client held %d bytes for a 1 KiB limit", p)
				}
			}},
		{name: "two dropped syncs are retried", faults: wintest.Faults{SyncDrops: 2}, req: sandbox.GuestExec{Argv: []string{"echo.exe", "x"}},
			check: func(t *testing.T, res *apitype.ExecResult, _ *qga.Client) {
				if string(res.Stdout) != "x\r\n" {
					t.Errorf("stdout %q", res.Stdout)
				}
			}},
		{name: "a channel that keeps failing gives up", faults: wintest.Faults{SyncDrops: 100}, req: sandbox.GuestExec{Argv: []string{"echo.exe"}}, wantErr: sandbox.ErrGuestUnavailable},
		{name: "sharing violations on the batch file are retried", faults: wintest.Faults{SharingViolations: 2}, req: sandbox.GuestExec{Argv: []string{"cmd.exe", "/c", "echo y"}},
			check: func(t *testing.T, res *apitype.ExecResult, _ *qga.Client) {
				if string(res.Stdout) != "y\r\n" {
					t.Errorf("stdout %q", res.Stdout)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, g, c := newWinGuest(t, qga.Options{})
			f.SetFaults(tc.faults)
			res, err := g.Exec(winCtx(t), tc.req)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, res, c)
		})
	}
}

// TestWinExecEnds: a caller giving up kills the command's tree; an agent
// that refuses because the guest is frozen is an error, not a result.
func TestWinExecEnds(t *testing.T) {
	f, g, _ := newWinGuest(t, qga.Options{})
	ctx, cancel := context.WithTimeout(winCtx(t), 300*time.Millisecond)
	defer cancel()
	if _, err := g.Exec(ctx, sandbox.GuestExec{Argv: []string{"sleep.exe"}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("abandoned exec: %v", err)
	}
	if len(f.Killed()) != 1 || f.Running() != 0 {
		t.Errorf("killed %v, %d left running", f.Killed(), f.Running())
	}
	f.SetFaults(wintest.Faults{ExecErrorClass: "CommandNotFound", ExecError: "Command guest-exec has been disabled: the agent is in frozen state"})
	if _, err := g.Exec(winCtx(t), sandbox.GuestExec{Argv: []string{"echo.exe"}}); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("exec into a frozen guest: %v", err)
	}
}

func TestWinFiles(t *testing.T) {
	ctx := winCtx(t)
	f, g, _ := newWinGuest(t, qga.Options{MaxChunk: 64 << 10})
	body := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320000 bytes: several chunks
	// a missing parent is created; / is taken as \
	if err := g.WriteFile(ctx, `C:/Users/agent/Desktop/out.bin`, bytes.NewReader(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, ok := f.File(`C:\Users\agent\Desktop\out.bin`); !ok || !bytes.Equal(got, body) {
		t.Fatalf("guest file: %v, %d bytes", ok, len(got))
	}
	if left := f.Files(); len(left) != 1 {
		t.Errorf("files in the guest: %v (temp or batch files left)", left)
	}
	var back bytes.Buffer
	n, err := g.ReadFile(ctx, `c:\users\agent\desktop\out.bin`, &back, 1<<20)
	if err != nil || n != int64(len(body)) || !bytes.Equal(back.Bytes(), body) {
		t.Fatalf("read back %d bytes, %v", n, err)
	}
	// overwrite in place
	if err := g.WriteFile(ctx, `C:\Users\agent\Desktop\out.bin`, strings.NewReader("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.File(`C:\Users\agent\Desktop\out.bin`); string(got) != "short" {
		t.Errorf("after overwrite %q", got)
	}
	sized, ok := g.(interface {
		ReadFileSized(context.Context, string, io.Writer, int64, func(int64) error) (int64, error)
	})
	if !ok {
		t.Fatal("the Windows guest has no sized read")
	}
	var told int64 = -1
	if _, err := sized.ReadFileSized(ctx, `C:\Users\agent\Desktop\out.bin`, io.Discard, 100, func(n int64) error { told = n; return nil }); err != nil || told != 5 {
		t.Errorf("sized read: size %d, %v", told, err)
	}

	tests := []struct {
		name  string
		read  bool
		path  string
		limit int64
		want  error
	}{
		{"read over the limit", true, `C:\Users\agent\Desktop\out.bin`, 3, sandbox.ErrTooLarge},
		{"read a missing file", true, `C:\Users\nobody.txt`, 100, sandbox.ErrFileNotFound},
		{"read in a missing directory", true, `C:\nowhere\x.txt`, 100, sandbox.ErrFileNotFound},
		{"read a directory", true, `C:\Windows`, 100, sandbox.ErrPermission},
		{"read the root", true, `C:\`, 100, sandbox.ErrIsDirectory},
		{"write over a directory", false, `C:\Users\agent`, 0, sandbox.ErrIsDirectory},
		{"write the root", false, `D:/`, 0, sandbox.ErrIsDirectory},
		{"relative", true, `Users\x`, 100, sandbox.ErrGuestInvalid},
		{"POSIX path", false, `/etc/hosts`, 0, sandbox.ErrGuestInvalid},
		{"UNC path", true, `\\server\share\x`, 100, sandbox.ErrGuestInvalid},
		{"dot dot", false, `C:\Users\..\Windows\x`, 0, sandbox.ErrGuestInvalid},
		{"device name", false, `C:\Users\nul.txt`, 0, sandbox.ErrGuestInvalid},
		{"data stream", true, `C:\Users\a.txt:hidden`, 100, sandbox.ErrGuestInvalid},
		{"trailing dot", false, `C:\Users\a.`, 0, sandbox.ErrGuestInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.read {
				_, err = g.ReadFile(ctx, tc.path, io.Discard, tc.limit)
			} else {
				err = g.WriteFile(ctx, tc.path, strings.NewReader("x"), 0o644)
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("err %v, want %v", err, tc.want)
			}
		})
	}
	if left := f.Files(); len(left) != 1 {
		t.Errorf("files in the guest: %v (temp or batch files left)", left)
	}
}

func TestCleanWinPath(t *testing.T) {
	for in, want := range map[string]string{
		`c:\Users\x`:       `C:\Users\x`,
		`C:/Users//x/`:     `C:\Users\x`,
		`D:\`:              `D:\`,
		`C:\Program Files`: `C:\Program Files`,
		`C:\a\con.d\b`:     "",
		`C:\a\COM1`:        "",
		`C:x`:              "",
		`C:\a?b`:           "",
		"C:\\a\x01":        "",
	} {
		got, err := qga.CleanWinPath(in)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("CleanWinPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
