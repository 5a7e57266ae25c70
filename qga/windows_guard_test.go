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

// TestWinDynamicVarEnv: cmd.exe reads %ERRORLEVEL% (and !ERRORLEVEL!)
// from an environment variable of that name when one is set (set /?: "If
// the user explicitly defines a variable with one of these names, then
// that definition will override the dynamic one"), and the client's
// batch files end with exit /b %errorlevel%, so a Windows exec's Env may
// not set cmd.exe's dynamic names (in any case): the exec is refused
// before anything runs.
func TestWinDynamicVarEnv(t *testing.T) {
	for _, req := range []sandbox.GuestExec{
		{Argv: []string{"cmd.exe", "/c", "exit /b 3"}, Env: map[string]string{"ERRORLEVEL": "0"}},
		{Argv: []string{"exit.exe", "3"}, Env: map[string]string{"errorlevel": "0"}, Cwd: `C:\Users`},
		{Argv: []string{"echo.exe"}, Env: map[string]string{"Cd": `C:\`}},
		{Argv: []string{"echo.exe"}, Env: map[string]string{"HighestNumaNodeNumber": "0"}},
	} {
		f, g, _ := newWinGuest(t, qga.Options{})
		_, err := g.Exec(winCtx(t), req)
		if !errors.Is(err, sandbox.ErrGuestInvalid) {
			t.Errorf("argv %q env %v: got %v, want ErrGuestInvalid (a dynamic variable of cmd.exe)", req.Argv, req.Env, err)
		}
		if n := len(f.Execs()); n != 0 {
			t.Errorf("argv %q env %v: %d guest-execs, want none", req.Argv, req.Env, n)
		}
	}
	_, g, _ := newWinGuest(t, qga.Options{})
	res, err := g.Exec(winCtx(t), sandbox.GuestExec{Argv: []string{"exit.exe", "3"}, Env: map[string]string{"ERRORLEVELS": "0"}, Cwd: `C:\Users`})
	if err != nil || res.ExitCode != 3 {
		t.Errorf("a name that only starts like ERRORLEVEL: %+v, %v; want exit 3", res, err)
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

// TestWinCmdlineUTF16: cmd.exe's 8191-character line is 8191 UTF-16
// code units, so an argv of characters outside the BMP (two units each)
// run in a cwd is refused by the units it takes, not by its runes.
func TestWinCmdlineUTF16(t *testing.T) {
	_, g, _ := newWinGuest(t, qga.Options{})
	arg := strings.Repeat("\U0001F600", 4500) // 4500 runes, 9000 UTF-16 units
	_, err := g.Exec(winCtx(t), sandbox.GuestExec{Argv: []string{"echo.exe", arg}, Cwd: `C:\Users`})
	if !errors.Is(err, sandbox.ErrGuestInvalid) {
		t.Errorf("an argv of 9000 UTF-16 units in a cwd: got %v, want ErrGuestInvalid (over cmd.exe's %d-character line)", err, 8191)
	}
	arg = strings.Repeat("\U0001F600", 3900) // 7800 units: under the line
	if _, err := g.Exec(winCtx(t), sandbox.GuestExec{Argv: []string{"echo.exe", arg}, Cwd: `C:\Users`}); err != nil {
		t.Errorf("an argv of 7800 UTF-16 units in a cwd: %v", err)
	}
}

// TestWinShellTrailingCaret: a caret at the end of a line escapes the
// line end, so cmd.exe joins the next line to it, and an unclosed "("
// swallows the lines after it; a shell string therefore runs from a batch
// file of its own, called from the client's fixed one, whose exit line
// it cannot reach. Both files are removed afterwards.
func TestWinShellTrailingCaret(t *testing.T) {
	for _, tc := range []struct {
		s    string
		code int // -1: not checked (the fake does not model blocks)
	}{
		{"echo a ^", 0},
		{"exit.exe 4\r\necho a ^", 0},
		{"exit.exe 4\r\n(echo b", -1},
	} {
		f, g, _ := newWinGuest(t, qga.Options{})
		res, err := g.Exec(winCtx(t), sandbox.GuestExec{Argv: []string{"cmd.exe", "/c", tc.s}, Cwd: `C:\Users`})
		if err != nil {
			t.Fatalf("%q: %v", tc.s, err)
		}
		e := f.Execs()[0]
		if want := "@echo off\r\n" + tc.s + "\r\n"; e.Body != want {
			t.Errorf("%q: the string's batch file %q, want %q", tc.s, e.Body, want)
		}
		if strings.Contains(e.Script, tc.s) || !strings.HasSuffix(e.Script, "call \"%PVE_INSPECT_SHELL%\"\r\nexit /b %errorlevel%\r\n") {
			t.Errorf("%q: the batch file run holds the string or lacks call and exit:\n%s", tc.s, e.Script)
		}
		if tc.code >= 0 && res.ExitCode != tc.code {
			t.Errorf("%q: exit %d, want %d (stderr %q)", tc.s, res.ExitCode, tc.code, res.Stderr)
		}
		if left := f.Files(); len(left) != 0 {
			t.Errorf("%q: files left in the guest: %v", tc.s, left)
		}
	}
}

// TestWinCwdProgramQuoted: with a cwd the argv runs as cmd.exe's command
// line (!PVE_INSPECT_CMDLINE!), where the program is cmd.exe's command
// token: unquoted, it would end at cmd.exe's delimiters , ; = as well as
// blanks (C:\tools\a=b.exe would run C:\tools\a), and a name like
// "echo.exe", "dir" or "call" would be taken for cmd.exe's built-in. A
// quoted command token is always an external program, so argv[0] is
// always quoted.
func TestWinCwdProgramQuoted(t *testing.T) {
	for _, prog := range []string{`C:\tools\a=b.exe`, `echo.exe`, `call`} {
		f, g, _ := newWinGuest(t, qga.Options{})
		if _, err := g.Exec(winCtx(t), sandbox.GuestExec{Argv: []string{prog, "%PATH%"}, Cwd: `C:\Users`}); err != nil {
			t.Fatalf("program %q: %v", prog, err)
		}
		want := `"` + prog + `" %PATH%`
		if line := f.Execs()[0].Getenv("PVE_INSPECT_CMDLINE"); line != want {
			t.Errorf("program %q: command line %q, want %q (cmd.exe reads an unquoted program with its own rules)", prog, line, want)
		}
	}
}
