package ctguest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// envSet splits `env -0` output into its sorted entries.
func envSet(b []byte) []string {
	l := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	slices.Sort(l)
	return l
}

// TestExec runs commands in a real unprivileged container: argv bytes
// intact, stdin, the environment exactly BaseEnv plus the request's (the
// test process's own secret absent), cwd, user, exit codes (125 for a
// setup failure, 126, 127, 128+signal), per-stream output limits with
// truncation flags.
func TestExec(t *testing.T) {
	ctx := testCtx(t, 5*time.Minute)
	var r [8]byte
	_, _ = rand.Read(r[:])
	secret := "pve-inspect-secret-" + hex.EncodeToString(r[:])
	t.Setenv("PVE_INSPECT_TEST_SECRET", secret)
	e := startCTs(ctx, t, testvm.ContainerSpec{VMID: 321, Hostname: "ctexec"})
	g := e.c.Guest(321)
	if err := g.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	daemonHome := strings.TrimSpace(e.sh(ctx, t, 321, "getent passwd daemon | cut -d: -f6"))
	odd := []string{"", " a b ", "\xff\xfe\x01", "$(id)`id`", "-n", `'"\`, "line\nbreak", "*", "x=y"}
	stdin := make([]byte, 3<<20)
	_, _ = rand.Read(stdin)
	sum := sha256.Sum256(stdin)
	tests := []struct {
		name string
		req  sandbox.GuestExec
		exit int
		// stdout, when set, is the exact stdout; stderr a part of stderr
		stdout, stderr     string
		outTrunc, errTrunc bool
		env                []string // the sorted `env -0` entries
	}{
		{name: "argv bytes", req: sandbox.GuestExec{Argv: append([]string{"printf", `%s\0`}, odd...)}, stdout: strings.Join(odd, "\x00") + "\x00"},
		{name: "program name with =", req: sandbox.GuestExec{Argv: []string{"x=y"}}, exit: 127, stderr: "x=y"},
		{name: "stdin", req: sandbox.GuestExec{Argv: []string{"sha256sum"}, Stdin: stdin}, stdout: hex.EncodeToString(sum[:]) + "  -\n"},
		{name: "base env", req: sandbox.GuestExec{Argv: []string{"env", "-0"}}, env: slices.Sorted(slices.Values(qga.BaseEnv()))},
		{name: "request env", req: sandbox.GuestExec{Argv: []string{"env", "-0"}, Env: map[string]string{"A": "b c\nd", "PATH": "/usr/bin:/bin", "LANG": "C"}},
			env: []string{"A=b c\nd", "HOME=/root", "LANG=C", "PATH=/usr/bin:/bin"}},
		{name: "user's env", req: sandbox.GuestExec{Argv: []string{"env", "-0"}, User: "daemon"},
			env: []string{"HOME=" + daemonHome, "LANG=C.UTF-8", "LOGNAME=daemon", "PATH=" + qga.BasePath, "USER=daemon"}},
		{name: "user and cwd", req: sandbox.GuestExec{Argv: []string{"sh", "-c", "id -u; id -g; pwd"}, User: "daemon", Cwd: "/tmp"}, stdout: "1\n1\n/tmp\n"},
		{name: "numeric user", req: sandbox.GuestExec{Argv: []string{"id", "-u"}, User: "65534"}, stdout: "65534\n"},
		{name: "unknown user", req: sandbox.GuestExec{Argv: []string{"id"}, User: "nosuchuser"}, exit: ExitSetupFailed, stderr: "no such user: nosuchuser"},
		{name: "cwd missing", req: sandbox.GuestExec{Argv: []string{"pwd"}, Cwd: "/nonexistent"}, exit: ExitSetupFailed, stderr: "cannot enter working directory"},
		{name: "exit status", req: sandbox.GuestExec{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, exit: 3, stdout: "out\n", stderr: "err\n"},
		{name: "not found", req: sandbox.GuestExec{Argv: []string{"no-such-program"}}, exit: 127, stderr: "no-such-program"},
		{name: "not executable", req: sandbox.GuestExec{Argv: []string{"/etc/passwd"}}, exit: 126},
		{name: "killed by a signal", req: sandbox.GuestExec{Argv: []string{"sh", "-c", "kill -TERM $$"}}, exit: 143},
		{name: "stdout limit", req: sandbox.GuestExec{Argv: []string{"sh", "-c", "head -c 100000 /dev/zero; echo done >&2"}, OutputLimit: 1000},
			stdout: string(make([]byte, 1000)), stderr: "done", outTrunc: true},
		{name: "stderr limit", req: sandbox.GuestExec{Argv: []string{"sh", "-c", "yes | head -c 10000000 >&2; echo ok"}, OutputLimit: 100},
			stdout: "ok\n", errTrunc: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := g.Exec(ctx, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if res.Stdout == nil || res.Stderr == nil {
				t.Errorf("stdout %v, stderr %v: want empty, not nil (the API's result has them as strings)", res.Stdout, res.Stderr)
			}
			if res.ExitCode != tt.exit || res.TimedOut || res.StdoutTruncated != tt.outTrunc || res.StderrTruncated != tt.errTrunc {
				t.Errorf("exit %d timed out %v truncated %v/%v; want %d false %v/%v (stderr %q)", res.ExitCode, res.TimedOut,
					res.StdoutTruncated, res.StderrTruncated, tt.exit, tt.outTrunc, tt.errTrunc, res.Stderr)
			}
			if tt.stdout != "" && string(res.Stdout) != tt.stdout {
				t.Errorf("stdout %q, want %q", res.Stdout, tt.stdout)
			}
			if !strings.Contains(string(res.Stderr), tt.stderr) || tt.errTrunc && len(res.Stderr) != 100 {
				t.Errorf("stderr %q, want %q in it", res.Stderr, tt.stderr)
			}
			if tt.env != nil && !slices.Equal(envSet(res.Stdout), tt.env) {
				t.Errorf("env %q, want %q", envSet(res.Stdout), tt.env)
			}
			if bytes.Contains(res.Stdout, []byte(secret)) || bytes.Contains(res.Stderr, []byte(secret)) {
				t.Error("the test process's secret reached the container")
			}
		})
	}
	t.Run("host uids", func(t *testing.T) { testHostUIDs(ctx, t, e) })
	t.Run("ExecStream streams", func(t *testing.T) { testStreams(ctx, t, e) })
	e.nothingLeft(t, 321, "sleep 6")
}

// writerFunc is an io.Writer calling f.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// testHostUIDs: the processes of an exec run as the container's ids,
// 100000 + the uid inside, from the host's view (lxc-attach itself, in
// the exec cgroup on the host's side, as host root).
func testHostUIDs(ctx context.Context, t *testing.T, e *bedCTs) {
	for _, c := range []struct{ user, host string }{{"", "100000"}, {"daemon", "100001"}} {
		ctx, cancel := context.WithCancel(ctx)
		seen := false
		out := writerFunc(func(b []byte) (int, error) {
			defer cancel()
			cgs := e.execCgroups(t, 321)
			if len(cgs) != 1 {
				t.Errorf("exec cgroups %v", cgs)
				return len(b), nil
			}
			procs, _ := os.ReadFile(cgs[0] + "/cgroup.procs")
			for _, p := range strings.Fields(string(procs)) {
				var pid int
				fmt.Sscan(p, &pid)
				uids := status(pid, "Uid")
				inCT := len(strings.Fields(strings.TrimPrefix(statusLine(pid, "NSpid"), "NSpid:"))) == 2
				t.Logf("user %q: pid %s uid %s in the container's pid namespace %v", c.user, p, uids, inCT)
				if inCT && uids != c.host || !inCT && uids != "0" {
					t.Errorf("pid %s (in the container: %v) runs as host uid %s", p, inCT, uids)
				}
				seen = seen || inCT
			}
			return len(b), nil
		})
		_, err := e.c.Guest(321).ExecStream(ctx, sandbox.GuestExec{Argv: []string{"sh", "-c", "echo ready; exec sleep 600"}, User: c.user}, out, nil)
		cancel()
		if !errors.Is(err, context.Canceled) || !seen {
			t.Errorf("user %q: %v, saw a container process: %v", c.user, err, seen)
		}
		// a cancelled call removes its exec cgroup before it returns (an
		// error joined to the context's when it could not): one left
		// here is this call's, not the next test's
		if left := e.execCgroups(t, 321); len(left) != 0 {
			t.Errorf("user %q: exec cgroups left by the cancelled call: %v (%v)", c.user, left, err)
		}
	}
}

// statusLine is a whole line of /proc/<pid>/status.
func statusLine(pid int, key string) string {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, key+":") {
			return l
		}
	}
	return ""
}

// testStreams: ExecStream hands the first line over while the command
// still runs (it waits for a file the writer makes through another exec).
func testStreams(ctx context.Context, t *testing.T, e *bedCTs) {
	g := e.c.Guest(321)
	// the first line's check counts exec cgroups: none may be another's
	if left := e.execCgroups(t, 321); len(left) != 0 {
		t.Fatalf("exec cgroups left by earlier calls: %v", left)
	}
	var writes []string
	out := writerFunc(func(b []byte) (int, error) {
		writes = append(writes, string(b))
		if string(b) == "first\n" {
			if cgs := e.execCgroups(t, 321); len(cgs) != 1 {
				t.Errorf("while the first line is handed over: exec cgroups %v", cgs)
			} else if busy, _ := populated(cgs[0]); !busy {
				t.Error("the command ended before its first line was handed over")
			}
			e.sh(ctx, t, 321, "touch /tmp/go-on")
		}
		return len(b), nil
	})
	res, err := g.ExecStream(ctx, sandbox.GuestExec{Argv: []string{"sh", "-c", "echo first; while [ ! -e /tmp/go-on ]; do sleep 0.05; done; echo second"}, Timeout: 120}, out, nil)
	if err != nil || res.ExitCode != 0 || !slices.Equal(writes, []string{"first\n", "second\n"}) {
		t.Errorf("%+v %v; writes %q", res, err, writes)
	}
	if res != nil && (len(res.Stdout) != 0 || res.Stdout == nil) {
		t.Errorf("ExecStream's result holds stdout %q", res.Stdout)
	}
}

// TestExecKillsTree: when the timeout passes, when the command exits and
// when the context ends, every process the exec started is killed, those
// that left its session or process group, were reparented to the
// container's init or tried to move to another cgroup of the container
// too; the exec's cgroup is removed. The container's root cannot move a
// process out of the exec cgroup.
func TestExecKillsTree(t *testing.T) {
	ctx := testCtx(t, 5*time.Minute)
	e := startCTs(ctx, t, testvm.ContainerSpec{VMID: 322})
	g := e.c.Guest(322)
	// detach forks four sleeps (sleep <mark>1 to 4) that leave the exec's
	// session and process group or its parent; escape writes the shell's
	// pid into every cgroup.procs the container sees.
	detach := func(mark string) string {
		return `setsid sh -c "sleep ` + mark + `1 & exec sleep ` + mark + `2" & nohup sleep ` + mark + `3 >/dev/null 2>&1 & (sleep ` + mark + `4 &); `
	}
	const escape = `for f in /sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/unified/cgroup.procs /sys/fs/cgroup/unified/*/cgroup.procs; do echo $$ 2>/dev/null >"$f"; done; `
	tests := []struct {
		name, mark, cmd string
		timeout         int64
		cancel          bool // cancel ctx once the sleeps run
		release         bool // touch /tmp/exit-<mark> once the sleeps run
		exit            int
		timedOut        bool
	}{
		{name: "timeout", mark: "42420", cmd: "echo started; exec sleep 424205", timeout: 2, exit: 137, timedOut: true},
		// exits once the test has seen its sleeps (it touches the file):
		// exiting at once, a loaded machine's forks could still be on
		// their way when the exit's kill came (a CI failure)
		{name: "exit leaves children", mark: "42421", cmd: "echo started; while [ ! -e /tmp/exit-42421 ]; do sleep 0.1; done", exit: 0, release: true},
		{name: "context ends", mark: "42422", cmd: "echo started; exec sleep 424225", cancel: true},
		{name: "escape attempt", mark: "42423", cmd: escape + "echo started; exec sleep 424235", timeout: 3, exit: 137, timedOut: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			var out bytes.Buffer
			w := writerFunc(func(b []byte) (int, error) {
				out.Write(b)
				// the command waits for its output to be taken: its
				// sleeps are up before the timeout passes
				sleeps := e.waitProcs(t, 322, "sleep\x00"+tt.mark, 4)
				for _, pid := range append(sleeps, e.ctProcs(t, 322, "echo $$")...) {
					cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
					if !bytes.Contains(cg, []byte("/"+execPrefix)) {
						t.Errorf("pid %d is out of the exec cgroup: %s", pid, cg)
					}
				}
				if tt.cancel {
					cancel()
				}
				if tt.release {
					e.raw(ctx, t, 322, "touch", "/tmp/exit-"+tt.mark)
				}
				return len(b), nil
			})
			cmd := detach(tt.mark) + tt.cmd
			res, err := g.ExecStream(ctx, sandbox.GuestExec{Argv: []string{"sh", "-c", cmd}, Timeout: tt.timeout}, w, nil)
			switch {
			case tt.cancel:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("%+v %v, want the context's end", res, err)
				}
			case err != nil:
				t.Fatal(err)
			case res.ExitCode != tt.exit || res.TimedOut != tt.timedOut || out.String() != "started\n":
				t.Errorf("exit %d timed out %v stdout %q; want %d %v", res.ExitCode, res.TimedOut, out.String(), tt.exit, tt.timedOut)
			}
			e.nothingLeft(t, 322, tt.mark)
		})
	}
}

// waitProcs waits (at most a minute) until n processes of container vmid
// have match in their command line, and returns them.
func (e *bedCTs) waitProcs(t *testing.T, vmid int, match string, n int) []int {
	t.Helper()
	for range 600 {
		if p := e.ctProcs(t, vmid, match); len(p) >= n {
			return p
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("fewer than %d processes %q in the container", n, match)
	return nil
}
