package wintest

import (
	"strconv"
	"strings"
)

// cmd runs cmd.exe: "/d /v:off /c FILE" runs a batch file the fake
// holds, "/d /c del /f /q FILE" deletes one; anything else fails.
func (a *Agent) cmd(e *Exec, argv []string) Result {
	switch {
	case len(argv) == 7 && strings.EqualFold(strings.Join(argv[1:6], " "), "/d /c del /f /q"):
		delete(a.files, strings.ToLower(argv[6]))
		return Result{}
	case len(argv) != 5 || argv[1] != "/d" || argv[2] != "/v:off" || argv[3] != "/c":
		return Result{Err: []byte("fake cmd.exe: unsupported invocation\r\n"), Code: 1}
	}
	b, ok := a.files[strings.ToLower(argv[4])]
	if !ok {
		return Result{Err: []byte("The system cannot find the path specified.\r\n"), Code: 1}
	}
	e.Script = string(b)
	r, _ := a.batch(e, batchLines(e.Script), `C:\Windows\system32`)
	return r
}

func batchLines(script string) []string {
	return strings.Split(strings.TrimSuffix(script, "\r\n"), "\r\n")
}

// batch interprets the lines of one of the client's batch files, and of
// a shell string's (run with call): echo, exit /b and the programs of
// Programs, starting in cwd. It returns the result and the working
// directory it ended in.
func (a *Agent) batch(e *Exec, lines []string, cwd string) (Result, string) {
	var acc Result
	level := 0
	ret := func(code int) (Result, string) { acc.Code = code; return acc, cwd }
	if len(lines) == 0 || lines[0] != "@echo off" {
		return Result{Err: []byte("fake cmd.exe: a batch file without @echo off\r\n"), Code: 1}, cwd
	}
	for _, l := range lines[1:] {
		env := e.Getenv
		switch {
		case l == `cd /d "%PVE_INSPECT_CWD%" || exit /b 125`:
			d := env("PVE_INSPECT_CWD")
			if !a.dirs[strings.ToLower(d)] {
				acc.Err = append(acc.Err, "The system cannot find the path specified.\r\n"...)
				return ret(125)
			}
			cwd = d
		case l == `call "%PVE_INSPECT_SHELL%"`:
			b, ok := a.files[strings.ToLower(env("PVE_INSPECT_SHELL"))]
			if !ok {
				acc.Err = append(acc.Err, "The system cannot find the path specified.\r\n"...)
				level = 1
				continue
			}
			e.Body = string(b)
			var r Result
			r, cwd = a.batch(e, batchLines(e.Body), cwd)
			if r.Running {
				return r, cwd
			}
			acc.Out, acc.Err, level = append(acc.Out, r.Out...), append(acc.Err, r.Err...), r.Code
		case l == "setlocal EnableDelayedExpansion":
		case l == "!PVE_INSPECT_CMDLINE!":
			r := a.run(e, SplitCmdline(env("PVE_INSPECT_CMDLINE")), cwd)
			if r.Running {
				return r, cwd
			}
			acc.Out, acc.Err, level = append(acc.Out, r.Out...), append(acc.Err, r.Err...), r.Code
		case l == "exit /b !errorlevel!" || l == "exit /b %errorlevel%":
			return ret(level)
		case l == `mkdir "%PVE_INSPECT_DIR%" >nul 2>nul`:
			if d := env("PVE_INSPECT_DIR"); len(d) > 3 && d[1] == ':' && d[2] == '\\' {
				a.mkdirLocked(d)
			}
		case l == `if exist "%PVE_INSPECT_DIR%\*" exit /b 0`:
			if a.dirs[strings.ToLower(env("PVE_INSPECT_DIR"))] {
				return ret(0)
			}
		case l == `if exist "%PVE_INSPECT_DST%\*" exit /b 3`:
			if a.dirs[strings.ToLower(env("PVE_INSPECT_DST"))] {
				return ret(3)
			}
		case l == `move /y "%PVE_INSPECT_SRC%" "%PVE_INSPECT_DST%" >nul || exit /b 1`:
			src, dst := strings.ToLower(env("PVE_INSPECT_SRC")), env("PVE_INSPECT_DST")
			data, ok := a.files[src]
			if !ok || !a.dirs[strings.ToLower(parent(dst))] {
				acc.Err = append(acc.Err, "The system cannot find the file specified.\r\n"...)
				return ret(1)
			}
			delete(a.files, src)
			a.files[strings.ToLower(dst)], a.names[strings.ToLower(dst)] = data, dst
		case l == `del /f /q "%PVE_INSPECT_SRC%" >nul 2>nul`:
			delete(a.files, strings.ToLower(env("PVE_INSPECT_SRC")))
		case strings.HasPrefix(l, "echo ") && strings.HasSuffix(l, " 1>&2"):
			acc.Err = append(acc.Err, strings.TrimSuffix(l[5:], " 1>&2")+"\r\n"...)
			level = 0
		case strings.HasPrefix(l, "echo "):
			acc.Out = append(acc.Out, l[5:]+"\r\n"...)
			level = 0
		case strings.HasPrefix(l, "exit /b "):
			n, _ := strconv.Atoi(l[len("exit /b "):])
			return ret(n)
		default:
			f := strings.Fields(l)
			if len(f) == 0 || a.Programs[strings.ToLower(f[0])] == nil {
				acc.Err = append(acc.Err, "'"+l+"' is not recognized as an internal or external command,\r\noperable program or batch file.\r\n"...)
				level = 9009
				continue
			}
			r := a.run(e, f, cwd)
			if r.Running {
				return r, cwd
			}
			acc.Out, acc.Err, level = append(acc.Out, r.Out...), append(acc.Err, r.Err...), r.Code
		}
	}
	return ret(level)
}

// run runs argv through Programs (9009 and cmd's message for an unknown
// program).
func (a *Agent) run(e *Exec, argv []string, cwd string) Result {
	if len(argv) == 0 {
		return Result{}
	}
	p := a.Programs[strings.ToLower(argv[0][strings.LastIndexAny(argv[0], `\/`)+1:])]
	if p == nil {
		return Result{Err: []byte("'" + argv[0] + "' is not recognized as an internal or external command,\r\noperable program or batch file.\r\n"), Code: 9009}
	}
	return p(a, e, argv, cwd)
}

// SplitCmdline splits a command line as the C runtime (and
// CommandLineToArgvW) does: white space separates arguments outside
// double quotes; 2n backslashes before a quote are n backslashes and the
// quote toggles quoting, 2n+1 are n and a literal quote; other
// backslashes are literal.
func SplitCmdline(s string) []string {
	var out []string
	var cur strings.Builder
	inArg, quoted := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			n := 0
			for i < len(s) && s[i] == '\\' {
				n++
				i++
			}
			if i < len(s) && s[i] == '"' {
				cur.WriteString(strings.Repeat(`\`, n/2))
				if n%2 == 1 {
					cur.WriteByte('"')
				} else {
					quoted = !quoted
				}
			} else {
				cur.WriteString(strings.Repeat(`\`, n))
				i--
			}
			inArg = true
		case c == '"':
			quoted, inArg = !quoted, true
		case (c == ' ' || c == '\t') && !quoted:
			if inArg {
				out = append(out, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteByte(c)
			inArg = true
		}
	}
	if inArg {
		out = append(out, cur.String())
	}
	return out
}
