package qga_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
)

// Guards of the Windows guest against cmd.exe's and Windows' own rules
// (review 48c of win37).

// TestReviewWinErrorlevelEnv: cmd.exe reads %ERRORLEVEL% (and
// !ERRORLEVEL!) from an environment variable of that name when one is
// set, and only falls back to the dynamic error level otherwise
// (set /?: "If the user explicitly defines a variable with one of these
// names, then that definition will override the dynamic one"). The
// batch files end with exit /b %errorlevel% (shell strings) and exit /b
// !errorlevel! (an argv in a cwd), and the request's Env is in their
// environment, so Env {"ERRORLEVEL": "0"} makes every such exec report
// exit 0 whatever the command returned. Fix: refuse cmd.exe's dynamic
// names (ERRORLEVEL, CD, CMDCMDLINE, CMDEXTVERSION, DATE, TIME, RANDOM,
// HIGHESTNUMANODENUMBER) in a Windows exec's Env, or keep them out of a
// batch file's environment.
func TestReviewWinErrorlevelEnv(t *testing.T) {
	for _, req := range []sandbox.GuestExec{
		{Argv: []string{"cmd.exe", "/c", "exit /b 3"}, Env: map[string]string{"ERRORLEVEL": "0"}},
		{Argv: []string{"exit.exe", "3"}, Env: map[string]string{"errorlevel": "0"}, Cwd: `C:\Users`},
	} {
		f, g, _ := newWinGuest(t, qga.Options{})
		_, err := g.Exec(winCtx(t), req)
		if errors.Is(err, sandbox.ErrGuestInvalid) {
			continue // refused: fixed
		}
		for _, e := range f.Execs() {
			if strings.Contains(strings.ToLower(e.Script), "errorlevel") && e.Getenv("ERRORLEVEL") != "" {
				t.Errorf("argv %q: the batch file ends with its error level read from %%ERRORLEVEL%%, and its environment sets ERRORLEVEL=%s: cmd.exe exits with that, not the command's status",
					req.Argv, e.Getenv("ERRORLEVEL"))
			}
		}
	}
}

// TestWinDeviceSuperscripts: Windows takes the ISO 8859-1 superscript
// digits as digits in COM# and LPT# device names (COM¹, LPT³.txt, ...:
// reserved in every directory, as COM1 is), so CleanWinPath refuses them
// as it refuses COM1.
func TestWinDeviceSuperscripts(t *testing.T) {
	for _, p := range []string{`C:\x\COM¹`, `C:\x\com².txt`, `C:\x\LPT³`, `C:\x\lpt¹.log`, `C:\x\COM0`, `C:\x\lpt0.txt`} {
		if q, err := qga.CleanWinPath(p); !errors.Is(err, qga.ErrInvalid) {
			t.Errorf("CleanWinPath(%q) = %q, %v; want ErrInvalid (a device name)", p, q, err)
		}
	}
}

// TestReviewWinCmdlineUTF16: cmd.exe's 8191-character line is 8191
// UTF-16 code units; winValidate counts runes, so an argv of characters
// outside the BMP (two units each) passes the check at up to twice the
// limit and cmd.exe then fails with "The input line is too long"
// instead of the 400 the check promises. Fix: count
// len(utf16.Encode([]rune(cmdline))).
func TestReviewWinCmdlineUTF16(t *testing.T) {
	_, g, _ := newWinGuest(t, qga.Options{})
	arg := strings.Repeat("\U0001F600", 4500) // 4500 runes, 9000 UTF-16 units
	_, err := g.Exec(winCtx(t), sandbox.GuestExec{Argv: []string{"echo.exe", arg}, Cwd: `C:\Users`})
	if !errors.Is(err, sandbox.ErrGuestInvalid) {
		t.Errorf("an argv of 9000 UTF-16 units in a cwd: got %v, want ErrGuestInvalid (over cmd.exe's %d-character line)", err, 8191)
	}
}

// TestReviewWinShellTrailingCaret: a shell string is written into the
// batch file right before the client's own "exit /b %errorlevel%"; a
// caret at the end of its last line escapes the line end, so cmd.exe
// joins the exit line to it ("echo a ^" prints "a exit /b 0" and the
// exit code is echo's), and an unclosed "(" swallows it the same way.
// Fix: keep the exit line out of reach of the string (the string in a
// batch file of its own, run with call from a fixed one that then exits
// with the error level).
func TestReviewWinShellTrailingCaret(t *testing.T) {
	f, g, _ := newWinGuest(t, qga.Options{})
	g.Exec(winCtx(t), sandbox.GuestExec{Argv: []string{"cmd.exe", "/c", "echo a ^"}})
	for _, e := range f.Execs() {
		lines := strings.Split(e.Script, "\r\n")
		for i := 1; i < len(lines); i++ {
			if strings.HasPrefix(lines[i], "exit /b") && strings.HasSuffix(lines[i-1], "^") {
				t.Errorf("the exit line follows a line ending in a caret, which joins it:\n%s", e.Script)
			}
		}
	}
}

// TestReviewWinCwdProgramQuoted: with a cwd the argv runs as cmd.exe's
// command line (!PVE_INSPECT_CMDLINE!), where the program is cmd.exe's
// command token: unquoted, it ends at cmd.exe's delimiters , ; = as well
// as blanks (C:\tools\a=b.exe runs C:\tools\a), and a name like
// "echo.exe", "dir" or "call" is taken for cmd.exe's built-in (call even
// expands %VAR% in the arguments a second time), unlike the same argv
// without a cwd. A quoted command token is always an external program.
// Fix: in winCmdline for the cwd script, always quote argv[0].
func TestReviewWinCwdProgramQuoted(t *testing.T) {
	for _, prog := range []string{`C:\tools\a=b.exe`, `echo.exe`, `call`} {
		f, g, _ := newWinGuest(t, qga.Options{})
		g.Exec(winCtx(t), sandbox.GuestExec{Argv: []string{prog, "%PATH%"}, Cwd: `C:\Users`})
		for _, e := range f.Execs() {
			if line := e.Getenv("PVE_INSPECT_CMDLINE"); line != "" && !strings.HasPrefix(line, `"`) {
				t.Errorf("program %q: command line %q: cmd.exe reads an unquoted program with its own rules", prog, line)
			}
		}
	}
}
