package qga

import (
	"context"
	"encoding/base64"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// envList splits `env -0` output into its entries.
func envList(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

// TestBaseEnv: the base environment is exactly the documented PATH, HOME
// and LANG, and every call returns a list of its own (a caller appending
// to or changing one cannot change the next exec's).
func TestBaseEnv(t *testing.T) {
	t.Parallel()
	want := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"LANG=C.UTF-8",
	}
	first := BaseEnv()
	if !slices.Equal(first, want) {
		t.Fatalf("BaseEnv() = %q, want %q", first, want)
	}
	first[0] = "PATH=/opt/a-bin"
	_ = append(first[:1], "BASH_ENV=/tmp/a.sh")
	if got := BaseEnv(); !slices.Equal(got, want) {
		t.Fatalf("after changing an earlier result, BaseEnv() = %q", got)
	}
	tagged := taggedEnv("0123")
	if !slices.Equal(tagged, append(want, envTagName+"=0123")) {
		t.Fatalf("taggedEnv = %q", tagged)
	}
}

// TestExecEnvNotFromGuest: every guest-exec the client sends carries a
// whole environment fixed on the client's side, whatever the guest
// prints: a guest whose every command prints an `env -0` list naming
// another PATH and a BASH_ENV (as a replaced /usr/bin/env did in issue
// 34) changes nothing, on the first exec or the next, on one client or a
// new agent for the same socket (a VMID reused by the next sandbox), on
// each path an exec takes.
func TestExecEnvNotFromGuest(t *testing.T) {
	t.Parallel()
	hostile := "PATH=/opt/a-bin\x00BASH_ENV=/tmp/a.sh\x00http_proxy=http://a.example:3128\x00"
	status := `{"exited": true, "exitcode": 0, "out-data": "` + base64.StdEncoding.EncodeToString([]byte(hostile)) + `"}`
	base := BaseEnv()
	tests := []struct {
		name string
		req  ExecRequest
		own  bool
		// want is the environment of the guest-exec that runs the
		// command (its path is cmd); tagged adds a tag entry.
		cmd    string
		tagged bool
	}{
		{name: "argv only: tagged direct", req: ExecRequest{Argv: []string{"bash", "-c", "true"}}, cmd: "bash", tagged: true},
		{name: "argv only, own session: setsid", req: ExecRequest{Argv: []string{"env"}}, own: true, cmd: setsidPath},
		{name: "env: wrapper", req: ExecRequest{Argv: []string{"env"}, Env: map[string]string{"A": "b"}}, cmd: "/bin/sh"},
		{name: "cwd: wrapper", req: ExecRequest{Argv: []string{"env"}, Cwd: "/tmp"}, cmd: "/bin/sh"},
		{name: "user: wrapper", req: ExecRequest{Argv: []string{"env"}, User: "nobody"}, cmd: "/bin/sh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newExecAgent(t, status)
			opts := hostileOptions()
			opts.ExecOwnSession = tt.own
			for i, c := range []*Client{New(opts), New(opts)} {
				for j := range 2 {
					if _, err := c.Agent(e.Socket).Exec(context.Background(), tt.req); err != nil {
						t.Fatalf("client %d exec %d: %v", i, j, err)
					}
					calls := e.calls()
					if len(calls) != 1 || calls[0].path != tt.cmd {
						t.Fatalf("client %d exec %d started %q, want only %s", i, j, paths(calls), tt.cmd)
					}
					env := calls[0].env
					if tt.tagged {
						if len(env) != len(base)+1 || !tagEntry.MatchString(env[len(base)]) {
							t.Fatalf("client %d exec %d: env %q, want BaseEnv and a tag", i, j, env)
						}
						env = env[:len(base)]
					}
					if !slices.Equal(env, base) {
						t.Fatalf("client %d exec %d: env %q, want %q", i, j, env, base)
					}
				}
			}
		})
	}
}

// TestExecTaggedEnv: on the real agent, the command of a direct exec sees
// exactly BaseEnv plus its tag (nothing of the agent's own environment),
// each exec a tag of its own; the setsid path sees exactly BaseEnv; the
// wrapper adds the request's env to it.
func TestExecTaggedEnv(t *testing.T) {
	g := startGuest(t)
	ctx := testCtx(t, time.Minute)
	base := BaseEnv()
	tags := map[string]bool{}
	a := New(Options{}).Agent(g.Socket)
	for i := range 2 {
		res, err := a.Exec(ctx, ExecRequest{Argv: []string{"env", "-0"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %d: %+v %v", i, res, err)
		}
		got := envList(res.Stdout)
		if len(got) != len(base)+1 || !slices.Equal(got[:len(base)], base) || !tagEntry.MatchString(got[len(base)]) {
			t.Fatalf("exec %d: command saw %q, want %q plus the tag", i, got, base)
		}
		tags[got[len(base)]] = true
	}
	if len(tags) != 2 {
		t.Fatalf("two execs shared a tag: %v", tags)
	}
	own := New(Options{ExecOwnSession: true}).Agent(g.Socket)
	res, err := own.Exec(ctx, ExecRequest{Argv: []string{"env", "-0"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("setsid path: %+v %v", res, err)
	}
	if got := envList(res.Stdout); !slices.Equal(got, base) {
		t.Fatalf("setsid path: command saw %q, want %q", got, base)
	}
	res, err = a.Exec(ctx, ExecRequest{Argv: []string{"env", "-0"}, Env: map[string]string{"A": "b", "PATH": "/usr/bin:/bin"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("wrapper: %+v %v", res, err)
	}
	got := envList(res.Stdout)
	for _, w := range []string{"A=b", "PATH=/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8"} {
		if !slices.Contains(got, w) {
			t.Fatalf("wrapper: command saw %q, want %s in it", got, w)
		}
	}
	for _, e := range got {
		name, _, _ := strings.Cut(e, "=")
		if !slices.Contains([]string{"A", "PATH", "HOME", "LANG", "PWD", "SHLVL", "_"}, name) {
			t.Fatalf("wrapper: command saw %q: %s is neither the base, the request's nor the shell's", got, e)
		}
	}
}

// TestExecTaggedTimeoutKillsEscapees: the tagged exec's timeout kills what
// a session and group kill misses: a background child that called setsid
// itself (holding the output), one that did so with its output
// redirected, and an orphan reparented to init; a second exec running on
// the same agent at the same time is not touched.
func TestExecTaggedTimeoutKillsEscapees(t *testing.T) {
	g := startGuest(t)
	a := New(Options{}).Agent(g.Socket)
	script := `setsid sleep 601 & setsid sh -c 'sleep 602 >/dev/null 2>&1' & (sleep 603 >/dev/null 2>&1 &); sleep 600`
	var wg sync.WaitGroup
	var other *ExecResult
	var otherErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		other, otherErr = a.Exec(testCtx(t, time.Minute), ExecRequest{Argv: []string{"sh", "-c", "sleep 5; echo survived"}, Timeout: 30 * time.Second})
	}()
	start := time.Now()
	res, err := a.Exec(testCtx(t, time.Minute), ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: 2 * time.Second})
	took := time.Since(start)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("timed out after %v", took)
	// no bound on took: an escapee left holding the output would hold
	// the exec for its 600 s, past the call's minute (an error above)
	if !res.TimedOut || res.Signal != 9 || res.ExitCode != 137 {
		t.Fatalf("got %+v after %v, want timed out with SIGKILL", res, took)
	}
	if otherErr != nil || other.ExitCode != 0 || other.TimedOut || string(other.Stdout) != "survived\n" {
		t.Fatalf("the concurrent exec: %+v stdout %q, %v; want it untouched", other, other.Stdout, otherErr)
	}
	if !guestHasNo(t, a, "sleep") {
		t.Fatal("sleep processes survived the timeout")
	}
}
