package ctguest

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pve-inspect/pve-inspect/qga"
)

// Everything the client runs in a container is a small POSIX sh script,
// run by the container's /bin/sh through lxc-attach. User data (argv,
// env, paths, the user) only ever travels as the script's positional
// parameters, never inside its text. Each script first prints the marker
// line on stdout, so the client can tell a script that ran (whatever its
// exit status) from an lxc-attach that failed to attach (which reports its
// own failures with exit status 1, like a command's).

const (
	// marker is the first line every script prints on stdout.
	marker = "pve-inspect-ctguest 1"
	// scriptName is the scripts' $0.
	scriptName = "pve-inspect"

	// ExitSetupFailed: the exec wrapper could not set up the working
	// directory or the user (the reason is on stderr), as qga's.
	ExitSetupFailed = qga.ExitSetupFailed
)

// Exit statuses of the file scripts (they never reach a caller as a
// status). The exec wrapper's own is ExitSetupFailed; 126 and 127 keep
// their shell meaning.
const (
	exitNotFound   = 20 // the path does not exist
	exitIsDir      = 21 // the path is a directory
	exitRefused    = 22 // the path exists but could not be opened
	exitMkdir      = 23 // the parent directory could not be made
	exitWrite      = 24 // writing the temporary file failed
	exitCommit     = 25 // chmod or rename of the temporary file failed
	exitSizeFailed = 26 // the size of the open file could not be read
)

// script is a POSIX sh script and its positional parameters.
type script struct {
	lines  []string
	params []string
}

// newScript starts a script: a fixed umask (not the daemon's) and the
// marker line.
func newScript() *script {
	s := &script{}
	s.add(`umask 022`)
	s.add(`printf '%%s\n' '%s' || exit %d`, marker, ExitSetupFailed)
	return s
}

// param adds v as a positional parameter and returns a quoted shell
// expression that expands to its exact bytes.
func (s *script) param(v string) string {
	s.params = append(s.params, v)
	return `"${` + strconv.Itoa(len(s.params)) + `}"`
}

func (s *script) add(format string, a ...any) { s.lines = append(s.lines, fmt.Sprintf(format, a...)) }

// argv is the command line that runs the script in the container.
func (s *script) argv() []string {
	return append([]string{"/bin/sh", "-c", strings.Join(s.lines, "\n"), scriptName}, s.params...)
}

// execScript is the wrapper of an exec: it sets up the user (its group,
// home directory) and the working directory, exiting ExitSetupFailed with
// the reason on stderr when it cannot, and execs the command through env
// -i (the command's environment is exactly qga.BaseEnv, the user's HOME, USER
// and LOGNAME, and the request's Env, later entries winning) and setpriv
// (util-linux: the user's ids and groups with User, nothing without; it
// also keeps a program name holding '=' from being read as env's
// assignment). The command inherits the wrapper's stdin, stdout and
// stderr, and its status (127 not found, 126 not executable) is the
// wrapper's.
func execScript(r *execRequest) *script {
	s := newScript()
	var userEnv, runas []string
	if r.User != "" {
		u := s.param(r.User)
		s.add(`u=%s; g=$(id -g -- "$u" 2>/dev/null) || { printf 'pve-inspect-exec: no such user: %%s\n' "$u" >&2; exit %d; }`, u, ExitSetupFailed)
		s.add(`h=$(getent passwd "$u" 2>/dev/null | cut -d: -f6)`)
		userEnv = []string{`"HOME=${h:-/}"`, `"USER=$u"`, `"LOGNAME=$u"`}
		runas = []string{`--reuid="$u"`, `--regid="$g"`, `--init-groups`}
	}
	cwd := r.Cwd
	if cwd == "" {
		cwd = "/"
	}
	s.add(`cd -- %s || { echo "pve-inspect-exec: cannot enter working directory" >&2; exit %d; }`, s.param(cwd), ExitSetupFailed)
	cmd := []string{"exec", "env", "-i"}
	for _, e := range qga.BaseEnv() {
		cmd = append(cmd, s.param(e))
	}
	cmd = append(cmd, userEnv...)
	keys := make([]string, 0, len(r.Env))
	for k := range r.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		cmd = append(cmd, s.param(k+"="+r.Env[k]))
	}
	cmd = append(cmd, "setpriv")
	cmd = append(cmd, runas...)
	cmd = append(cmd, "--")
	for _, a := range r.Argv {
		cmd = append(cmd, s.param(a))
	}
	s.add("%s", strings.Join(cmd, " "))
	return s
}

// pingScript only prints the marker.
func pingScript() *script {
	s := newScript()
	s.add(`exit 0`)
	return s
}

// readScript prints the size of the file at p (its length when opened,
// from the open descriptor) on a line of its own and then its bytes. A
// missing path, a directory and a refused open end it with exitNotFound,
// exitIsDir and exitRefused before the size line. A FIFO blocks it in the
// open until the call's context ends.
func readScript(p string) *script {
	s := newScript()
	s.add(`p=%s`, s.param(p))
	s.add(`if [ -d "$p" ]; then exit %d; fi`, exitIsDir)
	s.add(`command exec 3<"$p" || { if [ -e "$p" ]; then exit %d; fi; exit %d; }`, exitRefused, exitNotFound)
	s.add(`n=$(stat -L -c %%s /proc/self/fd/3) || exit %d`, exitSizeFailed)
	s.add(`printf '%%s\n' "$n" || exit %d`, exitSizeFailed)
	s.add(`exec cat <&3 3<&-`)
	return s
}

// writeScript writes its stdin to the temporary file tmp (0600 while it is
// written), then gives it mode and renames it over p (mv -T: a symbolic
// link at p is replaced, not followed). p's parent directories are made
// first; a directory at p is refused (exitIsDir), as is one a symbolic
// link at p points to.
func writeScript(p, tmp, mode string) *script {
	s := newScript()
	s.add(`p=%s; t=%s; m=%s`, s.param(p), s.param(tmp), s.param(mode))
	s.add(`if [ -d "$p" ]; then exit %d; fi`, exitIsDir)
	s.add(`d=${t%%/*}; mkdir -p -- "${d:-/}" || exit %d`, exitMkdir)
	s.add(`umask 077`)
	s.add(`cat >"$t" || { rm -f -- "$t"; exit %d; }`, exitWrite)
	s.add(`chmod -- "$m" "$t" && mv -fT -- "$t" "$p" || { rm -f -- "$t"; exit %d; }`, exitCommit)
	return s
}

// removeScript removes the files at paths (cleanup after an aborted
// write).
func removeScript(paths ...string) *script {
	s := newScript()
	args := make([]string, len(paths))
	for i, p := range paths {
		args[i] = s.param(p)
	}
	s.add(`exec rm -f -- %s`, strings.Join(args, " "))
	return s
}
