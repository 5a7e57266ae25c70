package ctguest

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
)

// runLocal runs a script with this machine's /bin/sh (what a container's
// Debian root has too) and returns its exit status and output.
func runLocal(t *testing.T, sc *script, stdin string) (int, string, string) {
	t.Helper()
	argv := sc.argv()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = qga.BaseEnv()
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// TestExecScriptLocal runs the exec wrapper with this machine's sh, env
// and setpriv: argv bytes arrive intact (a program name with '=' is a
// program, not env's assignment), the environment is exactly BaseEnv and
// the request's Env (the caller's environment is not passed on), a cwd
// that cannot be entered and an unknown user exit ExitSetupFailed with
// the reason on stderr, and 127 and 126 keep their meaning.
func TestExecScriptLocal(t *testing.T) {
	testkit.RequireTools(t, "sh", "env", "setpriv", "printf", "id", "getent")
	odd := []string{"", " a b ", "\xff\xfe\x01", "$(id)`id`", "-n", `'"\`, "line\nbreak", "*", "x=y", "${1}"}
	tests := []struct {
		name   string
		req    execRequest
		exit   int
		stdout string
		stderr string // a part of it
	}{
		{name: "argv bytes", req: execRequest{Argv: append([]string{"printf", `%s\0`}, odd...)}, stdout: strings.Join(odd, "\x00") + "\x00"},
		{name: "program name with =", req: execRequest{Argv: []string{"x=y", "a"}}, exit: 127, stderr: "x=y"},
		{name: "not executable", req: execRequest{Argv: []string{"/etc/passwd"}}, exit: 126},
		{name: "exit status", req: execRequest{Argv: []string{"sh", "-c", "exit 3"}}, exit: 3},
		{name: "base env", req: execRequest{Argv: []string{"env", "-0"}}, stdout: strings.Join(qga.BaseEnv(), "\x00") + "\x00"},
		{name: "request env over the base", req: execRequest{Argv: []string{"env", "-0"}, Env: map[string]string{"PATH": "/usr/bin:/bin", "Z": "a\nb", "A": "$x"}},
			stdout: "PATH=/usr/bin:/bin\x00HOME=/root\x00LANG=C.UTF-8\x00A=$x\x00Z=a\nb\x00"},
		{name: "cwd", req: execRequest{Argv: []string{"pwd"}, Cwd: "/tmp"}, stdout: "/tmp\n"},
		{name: "cwd by default /", req: execRequest{Argv: []string{"pwd"}}, stdout: "/\n"},
		{name: "cwd missing", req: execRequest{Argv: []string{"pwd"}, Cwd: "/nonexistent-dir"}, exit: ExitSetupFailed, stderr: "cannot enter working directory"},
		{name: "unknown user", req: execRequest{Argv: []string{"id"}, User: "no-such-user-x"}, exit: ExitSetupFailed, stderr: "no such user: no-such-user-x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := runLocal(t, execScript(&tt.req), "")
			payload, ok := strings.CutPrefix(out, marker+"\n")
			if !ok {
				t.Fatalf("no marker: %q", out)
			}
			if code != tt.exit || (tt.stdout != "" || tt.exit == 0) && payload != tt.stdout || !strings.Contains(errs, tt.stderr) {
				t.Errorf("exit %d stdout %q stderr %q; want %d %q %q", code, payload, errs, tt.exit, tt.stdout, tt.stderr)
			}
		})
	}
}

// TestFileScriptsLocal runs the read and write scripts with this
// machine's tools on a temp directory: statuses for a missing path and a
// directory, the size line, a write through a symbolic link replaces the
// link, and a directory at the target is refused.
func TestFileScriptsLocal(t *testing.T) {
	testkit.RequireTools(t, "sh", "stat", "cat", "mkdir", "chmod", "mv")
	dir := t.TempDir()
	f := dir + "/sub/f"
	if code, out, errs := runLocal(t, writeScript(f, dir+"/sub/.t", "0640"), "data\x00"); code != 0 || out != marker+"\n" {
		t.Fatalf("write: %d %q %q", code, out, errs)
	}
	if code, out, _ := runLocal(t, readScript(f), ""); code != 0 || out != marker+"\n5\ndata\x00" {
		t.Errorf("read: %d %q", code, out)
	}
	if code, out, _ := runLocal(t, execScript(&execRequest{Argv: []string{"stat", "-c", "%a", f}}), ""); code != 0 || out != marker+"\n640\n" {
		t.Errorf("mode: %d %q", code, out)
	}
	if code, _, _ := runLocal(t, readScript(dir+"/nothing"), ""); code != exitNotFound {
		t.Errorf("missing: %d", code)
	}
	if code, _, _ := runLocal(t, readScript(dir), ""); code != exitIsDir {
		t.Errorf("directory: %d", code)
	}
	if code, _, _ := runLocal(t, writeScript(dir+"/sub", dir+"/.t", "0644"), "x"); code != exitIsDir {
		t.Errorf("write over a directory: %d", code)
	}
	// a link at the target is replaced, its target untouched
	code, _, _ := runLocal(t, execScript(&execRequest{Argv: []string{"ln", "-s", f, dir + "/link"}}), "")
	if code != 0 {
		t.Fatal("ln")
	}
	if code, _, errs := runLocal(t, writeScript(dir+"/link", dir+"/.t2", "0600"), "new"); code != 0 {
		t.Fatalf("write over a link: %d %s", code, errs)
	}
	if _, out, _ := runLocal(t, readScript(f), ""); out != marker+"\n5\ndata\x00" {
		t.Errorf("the link's target changed: %q", out)
	}
	if _, out, _ := runLocal(t, readScript(dir+"/link"), ""); out != marker+"\n3\nnew" {
		t.Errorf("the link: %q", out)
	}
}

// TestRequestChecks: what the exec and file calls refuse before anything
// runs (wrapping sandbox.ErrGuestInvalid).
func TestRequestChecks(t *testing.T) {
	bad := []sandbox.GuestExec{
		{},
		{Argv: []string{""}},
		{Argv: []string{"a\x00b"}},
		{Argv: []string{"env"}, Env: map[string]string{"A-B": "x"}},
		{Argv: []string{"env"}, Env: map[string]string{"A": "x\x00"}},
		{Argv: []string{"pwd"}, Cwd: "/\x00"},
		{Argv: []string{"id"}, User: "a\x00"},
		{Argv: []string{"id"}, Timeout: -1},
		{Argv: []string{"id"}, OutputLimit: -1},
	}
	for _, r := range bad {
		if _, err := request(r); !errors.Is(err, sandbox.ErrGuestInvalid) {
			t.Errorf("%+v: %v", r, err)
		}
	}
	for _, p := range []string{"", "rel", "/a/../b", "/a/", "/a\x00"} {
		if err := checkPath(p); !errors.Is(err, sandbox.ErrGuestInvalid) {
			t.Errorf("path %q: %v", p, err)
		}
	}
	if err := checkPath("/a/\xff b"); err != nil {
		t.Errorf("a path of odd bytes: %v", err)
	}
}

// TestFileStatus: the file scripts' statuses map to the engine's guest
// sentinels; a write that ran out of space (the container's stderr says
// so) is ErrGuestNoSpace.
func TestFileStatus(t *testing.T) {
	for _, c := range []struct {
		code int
		diag string
		want error
	}{
		{exitNotFound, "", sandbox.ErrFileNotFound},
		{exitIsDir, "", sandbox.ErrIsDirectory},
		{exitRefused, "sh: cannot open /x: Permission denied", sandbox.ErrPermission},
		{exitWrite, "cat: write error: No space left on device", sandbox.ErrGuestNoSpace},
		{exitMkdir, "mkdir: cannot create directory '/a': Disk quota exceeded", sandbox.ErrGuestNoSpace},
	} {
		if err := fileStatus(c.code, []byte(c.diag)); !errors.Is(err, c.want) {
			t.Errorf("status %d %q: %v, want %v", c.code, c.diag, err, c.want)
		}
	}
	if err := fileStatus(exitCommit, []byte("mv: cannot move")); err == nil || !strings.Contains(err.Error(), "mv: cannot move") {
		t.Errorf("commit failure: %v", err)
	}
	if err := fileStatus(0, nil); err != nil {
		t.Error(err)
	}
}
