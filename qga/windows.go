package qga

// Windows guests. A VM whose os_type is Windows (win10, win11) runs
// qemu-ga's Windows build: the same protocol and commands, but no /bin/sh,
// /proc, setsid or POSIX paths, so the Linux paths of this package (the
// wrappers, the tagged kill, the temp-file output) cannot run there.
// WinGuest (Client.WindowsGuests) is the engine's guest for such a VM; the
// design decisions:
//
//   - An argv runs through guest-exec itself: path is argv[0], arg the
//     rest, with capture-output, so the agent collects the output (its
//     16 MiB cap per stream) and the client cuts each stream at the
//     request's limit while reading the status reply (replycut.go), as on
//     the Linux direct path. qemu-ga's Windows build hands the list to
//     GLib, which quotes it into one command line with the C runtime's
//     rules (CommandLineToArgvW reads it back unchanged). No shell is
//     involved.
//   - A shell string, argv ["cmd.exe", "/c", S] (cmd or cmd.exe, any
//     directory, /c or /C), cannot go that way: GLib's quoting escapes the
//     quotes in S with backslashes, which cmd.exe does not read. S becomes
//     the body of a batch file of its own (as the reference plugin does):
//     "@echo off" and S with its line ends made CRLF. A fixed batch file
//     changes to the working directory, runs it with call and ends with
//     "exit /b %errorlevel%", out of S's reach (a caret ending S's last
//     line, or an unclosed parenthesis, would join or swallow an exit line
//     in the same file). Both are written through guest-file-write to
//     fresh names in C:\Windows\Temp (qemu-ga expands no %TEMP%), the fixed
//     one run as cmd.exe /d /v:off /c FILE (no AutoRun, delayed expansion
//     off whatever the registry says), and both deleted afterwards. S is
//     read as batch text: %% is a literal %, and for-loop variables are
//     %%i. Only ["cmd" or "cmd.exe", "/c", S] is a shell string: with other
//     switches ("cmd /s /c", "cmd /d /c") the argv is an ordinary one,
//     which GLib quotes for the C runtime, not for cmd.exe.
//   - A .bat or .cmd argv[0] (outside a shell string) is run by Windows
//     through cmd.exe /c: its arguments are then cmd.exe text (operators
//     and %VAR% in them are cmd.exe's), not C runtime arguments.
//   - The environment is fixed on the client's side, as on Linux: every
//     guest-exec carries WinBaseEnv (the variables a LocalSystem service
//     sees on a Windows installed on C:) with the request's Env on top
//     (names compared without case, as Windows does). The Env may not set
//     cmd.exe's dynamic variables (ERRORLEVEL, CD, DATE, ...): a variable
//     of that name overrides the dynamic value, so the batch files'
//     exit /b %errorlevel% would report it. GLib gives the child
//     exactly the list, so nothing comes from the agent's own environment
//     and nothing the guest prints becomes part of it.
//   - A working directory needs a batch file too (guest-exec has none):
//     the file, whose text holds no request data, does
//     cd /d "%PVE_INSPECT_CWD%" (exit 125 when it fails, the Linux
//     wrapper's setup code) and then runs the argv's command line from
//     PVE_INSPECT_CMDLINE through delayed expansion (!VAR!), which happens
//     after cmd.exe parsed the line, so no character of the command line
//     is an operator (the line is then cmd.exe's: at most 8191 UTF-16
//     code units). argv[0] is always quoted there: cmd.exe ends an
//     unquoted command token at , ; = too and takes a name like "call" or
//     "echo.exe" for its built-in; a quoted one is an external program.
//     The data travels in the environment only. A path
//     cannot hold '"' on Windows (and cleanWinPath refuses it), so the
//     quoted cd cannot be broken out of; % expansion is one pass, so a %
//     in the path stays. A batch program run this way sees delayed
//     expansion on.
//   - user is refused (ErrInvalid: the API's 400): qemu-ga runs every
//     command as its service account and Windows has no setpriv; a
//     command that should run as someone else is the caller's to arrange
//     (runas needs a password).
//   - stdin travels in guest-exec's input-data, up to WinStdinMax.
//   - A timeout (or the caller giving up) kills the tree with
//     taskkill /T /F /PID pid, repeated every half second while the
//     agent reports the command running; the result then says TimedOut
//     (taskkill's TerminateProcess leaves exit code 1). /T follows parent
//     ids: a grandchild whose parent already exited escapes, and if it
//     holds the output pipes the agent never reports the exit, so the
//     call fails killGrace after the first kill.
//   - An exit status of 0xC0000000 or more is an NTSTATUS (an unhandled
//     exception); qemu-ga reports it as "signal" (qga/commands.c,
//     qmp_guest_exec_status); the result gives it as the exit code, as
//     the unsigned 32-bit value Windows' GetExitCodeProcess returns.
//   - A program the agent cannot start is an ordinary result, exit code
//     127, with the agent's reason (clipped) on stderr, like Linux (an
//     agent refusing because the guest is frozen stays an error).
//   - The health checks' file system report (guest-get-fsinfo) is the
//     Linux guest's: the Windows agent answers it with its volumes.
//   - ExecStream collects and then writes: qemu-ga gives captured output
//     only once the process ended, and the Linux path's guest temp files
//     need a POSIX wrapper.
//   - Files: guest-file-* with a drive-absolute path (cleanWinPath:
//     C:\dir\file, / taken as \, no . or .., no device names, no
//     alternate data streams). A write goes to a temporary file in the
//     target directory, renamed over the target (move /y, in a batch
//     file) once complete; a missing parent directory is created
//     (mkdir). mode is not applied (NTFS has ACLs, not permission bits).
//     Reads and writes keep the Linux limits and chunking.
//   - The Windows agent channel is flaky (the reference plugin retries
//     "got timeout" and "being used by another process"): a session whose
//     connect or sync fails, before any command was sent, is tried again
//     up to winSessionAttempts times; an open refused with a sharing
//     violation (a scanner holding the file just written) is tried again
//     up to winOpenAttempts times. Nothing that may have run is repeated.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

const (
	// winSessionAttempts and winSessionDelay bound the retries of a
	// Windows session that failed before its command was sent (the delay
	// doubles each time).
	winSessionAttempts = 3
	winSessionDelay    = 250 * time.Millisecond
	// winOpenAttempts bounds the tries of a guest-file-open refused with
	// a sharing violation.
	winOpenAttempts = 4

	// WinCmd, WinTaskkill and WinTempDir are the guest's cmd.exe,
	// taskkill.exe and the directory of the client's batch files and
	// temporary files (qemu-ga expands no environment variables in
	// paths).
	WinCmd      = `C:\Windows\System32\cmd.exe`
	WinTaskkill = `C:\Windows\System32\taskkill.exe`
	WinTempDir  = `C:\Windows\Temp`

	// WinStdinMax is the most stdin a Windows exec takes (it travels in
	// guest-exec's input-data).
	WinStdinMax = 8 << 20

	// winVar prefixes the environment variables the client's batch files
	// read; a request's Env may not use it.
	winVar = "PVE_INSPECT_"
)

// winDynamicVars are cmd.exe's dynamic variables: a variable of the
// environment with one of these names (in any case) overrides the dynamic
// value (set /?), so ERRORLEVEL in a request's Env would make the batch
// files' exit /b %errorlevel% report it instead of the command's status.
// A Windows exec's Env may not set them.
var winDynamicVars = []string{"CD", "DATE", "TIME", "RANDOM", "ERRORLEVEL",
	"CMDEXTVERSION", "CMDCMDLINE", "HIGHESTNUMANODENUMBER"}

// Windows' texts for the errors qemu-ga's file commands report (it
// appends the system message to its own: error_setg_win32).
const (
	winNotFoundFile = "The system cannot find the file specified"
	winNotFoundPath = "The system cannot find the path specified"
	winAccessDenied = "Access is denied"
	winBadName      = "The filename, directory name, or volume label syntax is incorrect"
	winSharing      = "being used by another process"
)

// WinBaseEnv returns the whole environment of a command started in a
// Windows guest before the request's Env is added: what a LocalSystem
// service sees on a 64-bit Windows installed on C:. It returns a new
// slice on each call.
func WinBaseEnv() []string {
	const sys = `C:\Windows\system32\config\systemprofile`
	return []string{
		`ALLUSERSPROFILE=C:\ProgramData`,
		`APPDATA=` + sys + `\AppData\Roaming`,
		`CommonProgramFiles=C:\Program Files\Common Files`,
		`CommonProgramFiles(x86)=C:\Program Files (x86)\Common Files`,
		`ComSpec=` + WinCmd,
		`LOCALAPPDATA=` + sys + `\AppData\Local`,
		`OS=Windows_NT`,
		`PATH=C:\Windows\system32;C:\Windows;C:\Windows\System32\Wbem;C:\Windows\System32\WindowsPowerShell\v1.0\`,
		`PATHEXT=.COM;.EXE;.BAT;.CMD;.VBS;.VBE;.JS;.JSE;.WSF;.WSH;.MSC`,
		`PROCESSOR_ARCHITECTURE=AMD64`,
		`ProgramData=C:\ProgramData`,
		`ProgramFiles=C:\Program Files`,
		`ProgramFiles(x86)=C:\Program Files (x86)`,
		`PSModulePath=C:\Program Files\WindowsPowerShell\Modules;C:\Windows\system32\WindowsPowerShell\v1.0\Modules`,
		`PUBLIC=C:\Users\Public`,
		`SystemDrive=C:`,
		`SystemRoot=C:\Windows`,
		`TEMP=` + WinTempDir,
		`TMP=` + WinTempDir,
		`USERPROFILE=` + sys,
		`windir=C:\Windows`,
	}
}

// winEnv is WinBaseEnv with env on top (a name of env replaces the base
// entry of the same name in any case), then the client's own variables.
func winEnv(env map[string]string, own ...string) []string {
	out := WinBaseEnv()
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out = slices.DeleteFunc(out, func(e string) bool {
			name, _, _ := strings.Cut(e, "=")
			return strings.EqualFold(name, k)
		})
	}
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	return append(out, own...)
}

// winValidate checks req for a Windows guest.
func winValidate(req *ExecRequest) error {
	if err := req.validate(); err != nil {
		return err
	}
	if req.User != "" {
		return fmt.Errorf("%w: user %q: a Windows guest runs every command as its agent's service account; user is not supported there", ErrInvalid, req.User)
	}
	for i, a := range req.Argv {
		if !utf8.ValidString(a) {
			return fmt.Errorf("%w: argv[%d] is not valid UTF-8 (a Windows command line is Unicode text)", ErrInvalid, i)
		}
	}
	for k, v := range req.Env {
		if len(k) >= len(winVar) && strings.EqualFold(k[:len(winVar)], winVar) {
			return fmt.Errorf("%w: env name %q: the %s prefix is the client's own", ErrInvalid, k, winVar)
		}
		if slices.ContainsFunc(winDynamicVars, func(d string) bool { return strings.EqualFold(d, k) }) {
			return fmt.Errorf("%w: env name %q: it is one of cmd.exe's dynamic variables (%s), which a variable of that name would override in the client's batch files", ErrInvalid, k, strings.Join(winDynamicVars, ", "))
		}
		if !utf8.ValidString(v) {
			return fmt.Errorf("%w: env %s is not valid UTF-8", ErrInvalid, k)
		}
	}
	if req.Cwd != "" {
		if _, err := cleanWinPath(req.Cwd); err != nil {
			return fmt.Errorf("cwd: %w", err)
		}
		if _, shell := winShell(req.Argv); !shell && utf16Len(winCmdline(req.Argv)) > winLineMax-64 {
			return fmt.Errorf("%w: with a cwd the command line goes through cmd.exe, which takes at most %d characters (UTF-16 code units)", ErrInvalid, winLineMax)
		}
	}
	return nil
}

// winShell returns S of a shell string argv ["cmd.exe", "/c", S].
func winShell(argv []string) (string, bool) {
	if len(argv) != 3 || !strings.EqualFold(argv[1], "/c") {
		return "", false
	}
	base := argv[0][strings.LastIndexAny(argv[0], `\/`)+1:]
	if !strings.EqualFold(base, "cmd") && !strings.EqualFold(base, "cmd.exe") {
		return "", false
	}
	return argv[2], true
}

// winArgvScript runs PVE_INSPECT_CMDLINE in PVE_INSPECT_CWD; its text
// holds no request data.
const winArgvScript = "@echo off\r\n" +
	"cd /d \"%PVE_INSPECT_CWD%\" || exit /b 125\r\n" +
	"setlocal EnableDelayedExpansion\r\n" +
	"!PVE_INSPECT_CMDLINE!\r\n" +
	"exit /b !errorlevel!\r\n"

// winShellScript runs the shell string's own batch file
// (PVE_INSPECT_SHELL) with call, in PVE_INSPECT_CWD when cwd, and exits
// with its error level; its text holds no request data. The string is
// kept out of this file so that nothing in it (a caret at the end of its
// last line, an unclosed parenthesis) can join or swallow the exit line.
func winShellScript(cwd bool) string {
	var b strings.Builder
	b.WriteString("@echo off\r\n")
	if cwd {
		b.WriteString("cd /d \"%PVE_INSPECT_CWD%\" || exit /b 125\r\n")
	}
	b.WriteString("call \"%PVE_INSPECT_SHELL%\"\r\n")
	b.WriteString("exit /b %errorlevel%\r\n")
	return b.String()
}

// winShellBody is the batch file of shell string s: "@echo off" and s
// with its line ends made CRLF.
func winShellBody(s string) string {
	return "@echo off\r\n" + strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\n", "\r\n") + "\r\n"
}

// utf16Len is the length of s in UTF-16 code units (what Windows counts
// in a command line).
func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		n += max(utf16.RuneLen(r), 1)
	}
	return n
}

// winCmdline joins argv into one command line for cmd.exe to run: the C
// runtime's quoting (what CommandLineToArgvW splits back into argv), with
// argv[0] always quoted, since cmd.exe reads an unquoted command token
// with its own rules (it ends at , ; = too, and a name like "call" or
// "echo.exe" is taken for a built-in); a quoted one is an external
// program.
func winCmdline(argv []string) string {
	var b strings.Builder
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
			b.WriteString(winQuote(a))
		} else {
			b.WriteString(winQuoted(a))
		}
	}
	return b.String()
}

// winQuote quotes one argument when it needs it (winQuoted), else
// returns it as it is.
func winQuote(a string) string {
	if a != "" && !strings.ContainsAny(a, " \t\n\v\"") {
		return a
	}
	return winQuoted(a)
}

// winQuoted quotes one argument: in double quotes, a quote as \" and the
// backslashes before a quote (or the closing one) doubled.
func winQuoted(a string) string {
	var b strings.Builder
	b.WriteByte('"')
	slashes := 0
	for i := 0; i < len(a); i++ {
		switch c := a[i]; c {
		case '\\':
			slashes++
		case '"':
			b.WriteString(strings.Repeat(`\`, 2*slashes+1))
			b.WriteByte('"')
			slashes = 0
		default:
			b.WriteString(strings.Repeat(`\`, slashes))
			b.WriteByte(c)
			slashes = 0
		}
	}
	b.WriteString(strings.Repeat(`\`, 2*slashes))
	b.WriteByte('"')
	return b.String()
}

// winBatch is the argv that runs batch file bat: without AutoRun (/d)
// and with delayed expansion off (/v:off, whatever the guest's registry
// says), so that a ! in an expanded path stays a !.
func winBatch(bat string) []string { return []string{WinCmd, "/d", "/v:off", "/c", bat} }

// winLineMax is the longest command line cmd.exe takes (8191
// characters); an argv run in a cwd goes through it.
const winLineMax = 8191

// winTempName is a fresh path in WinTempDir (no spaces: it is safe on a
// command line GLib quotes).
func winTempName(ext string) string {
	return WinTempDir + `\pve-inspect-` + randomTag() + randomTag() + ext
}

// winPlan is how one Windows exec runs: the argv guest-exec starts, its
// environment and the batch files to write before it (and to remove
// after).
type winPlan struct {
	argv  []string
	env   []string
	files []winTemp
}

// winTemp is one of the client's batch files: its path in WinTempDir and
// its text.
type winTemp struct{ path, text string }

func planWin(req *ExecRequest) winPlan {
	var own []string
	if req.Cwd != "" {
		cwd, _ := cleanWinPath(req.Cwd) // checked by winValidate
		own = append(own, winVar+"CWD="+cwd)
	}
	bat := winTempName(".cmd")
	if s, ok := winShell(req.Argv); ok {
		body := winTempName(".cmd")
		own = append(own, winVar+"SHELL="+body)
		return winPlan{argv: winBatch(bat), env: winEnv(req.Env, own...),
			files: []winTemp{{body, winShellBody(s)}, {bat, winShellScript(req.Cwd != "")}}}
	}
	if req.Cwd != "" {
		own = append(own, winVar+"CMDLINE="+winCmdline(req.Argv))
		return winPlan{argv: winBatch(bat), env: winEnv(req.Env, own...), files: []winTemp{{bat, winArgvScript}}}
	}
	return winPlan{argv: req.Argv, env: winEnv(req.Env)}
}

// winExec runs req in a Windows guest (the design decisions above).
func (a *Agent) winExec(ctx context.Context, req ExecRequest) (*ExecResult, error) {
	if err := winValidate(&req); err != nil {
		return nil, err
	}
	limit := req.OutputLimit
	if limit == 0 {
		limit = a.c.opts.OutputLimit
	}
	var input []byte
	if req.Stdin != nil {
		b, err := io.ReadAll(io.LimitReader(req.Stdin, WinStdinMax+1))
		if err != nil {
			return nil, fmt.Errorf("qga exec: read stdin: %w", err)
		}
		if len(b) > WinStdinMax {
			return nil, fmt.Errorf("%w: stdin over %d bytes (a Windows guest takes it in one guest-exec)", ErrInvalid, WinStdinMax)
		}
		if len(b) > 0 {
			input = b
		}
	}
	p := planWin(&req)
	for _, f := range p.files {
		if err := a.winPut(ctx, f.path, []byte(f.text)); err != nil {
			return nil, fmt.Errorf("qga exec: write the batch file: %w", err)
		}
		defer a.winRemove(ctx, f.path)
	}
	run := directRun{argv: p.argv, env: p.env, input: input, kill: a.winKill,
		holders: func(context.Context, int) error { return nil }}
	res, err := a.execCaptured(ctx, &req, limit, run)
	if errors.Is(err, errNotStarted) && !errors.Is(err, ErrFrozen) {
		msg := fmt.Sprintf("pve-inspect: the guest agent could not start %s: %s\r\n", winQuote(req.Argv[0]), clipString(err.Error(), maxDescLen))
		return &ExecResult{ExitCode: 127, Stdout: []byte{}, Stderr: []byte(msg), StderrBytes: int64(len(msg))}, nil
	}
	if err != nil {
		return nil, err
	}
	if res.Signal != 0 {
		res.ExitCode = int(uint32(int32(res.Signal))) // an NTSTATUS
		res.Signal = 0
	}
	return res, nil
}

// winKill kills the tree of pid (taskkill /T /F); a pid already gone is
// not an error (taskkill's 128).
func (a *Agent) winKill(ctx context.Context, pid int) error {
	_, err := a.runEnv(ctx, []string{WinTaskkill, "/T", "/F", "/PID", strconv.Itoa(pid)}, WinBaseEnv())
	return err
}

// winOpen opens p in mode, trying a sharing violation again.
func (a *Agent) winOpen(ctx context.Context, p, mode string) (int64, error) {
	var h int64
	for attempt := 1; ; attempt++ {
		err := a.session(ctx, func(cn *conn) (err error) {
			h, err = cn.fileOpen(p, mode)
			return err
		})
		var ae *AgentError
		if err == nil || !errors.As(err, &ae) || !strings.Contains(ae.Desc, winSharing) || attempt >= winOpenAttempts {
			return h, err
		}
		if serr := sleepCtx(ctx, winSessionDelay<<(attempt-1)); serr != nil {
			return 0, err
		}
	}
}

// winPut writes data to the new guest file p (the client's own batch
// files: small, one chunk).
func (a *Agent) winPut(ctx context.Context, p string, data []byte) error {
	h, err := a.winOpen(ctx, p, "w")
	if err != nil {
		return err
	}
	if _, err := a.writeHandle(ctx, h, data, nil); err != nil {
		a.closeHandles(ctx, h)
		a.winRemove(ctx, p)
		return err
	}
	return a.session(ctx, func(cn *conn) error { return cn.fileClose(h) })
}

// winRemove deletes one of the client's temp files (a name without
// spaces) on a fresh short context; failures are ignored.
func (a *Agent) winRemove(ctx context.Context, p string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handleCloseTimeout)
	defer cancel()
	a.runEnv(ctx, []string{WinCmd, "/d", "/c", "del", "/f", "/q", p}, WinBaseEnv())
}

// winHelper runs one of the client's batch scripts with vars (names
// without the prefix) in its environment and returns how it ended.
func (a *Agent) winHelper(ctx context.Context, script string, vars map[string]string) (*runResult, error) {
	bat := winTempName(".cmd")
	if err := a.winPut(ctx, bat, []byte(script)); err != nil {
		return nil, fmt.Errorf("write the batch file: %w", err)
	}
	defer a.winRemove(ctx, bat)
	var own []string
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		own = append(own, winVar+k+"="+vars[k])
	}
	return a.runEnv(ctx, winBatch(bat), winEnv(nil, own...))
}

// winStream is ExecStream for a Windows guest: collected, then written.
func (a *Agent) winStream(ctx context.Context, req ExecRequest, stdout, stderr io.Writer) (*ExecResult, error) {
	res, err := a.winExec(ctx, req)
	if err != nil {
		return nil, err
	}
	for _, s := range []struct {
		w io.Writer
		b []byte
	}{{stdout, res.Stdout}, {stderr, res.Stderr}} {
		if s.w != nil && len(s.b) > 0 {
			if _, err := io.Copy(s.w, bytes.NewReader(s.b)); err != nil {
				return nil, fmt.Errorf("qga exec: deliver output: %w", err)
			}
		}
	}
	res.Stdout, res.Stderr = nil, nil
	return res, nil
}
