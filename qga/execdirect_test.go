package qga

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestExecPlan: which path a collected exec takes.
func TestExecPlan(t *testing.T) {
	t.Parallel()
	a := New(Options{}).Agent("/nonexistent")
	tests := []struct {
		name   string
		req    ExecRequest
		path   string // direct, wrapper, stream
		limit  int64
		reason string
	}{
		{"plain", ExecRequest{Argv: []string{"true"}}, "direct", DefaultOutputLimit, ""},
		{"timeout and limit", ExecRequest{Argv: []string{"sleep", "1"}, Timeout: time.Second, OutputLimit: 5}, "direct", 5, ""},
		{"limit just below the agent cap", ExecRequest{Argv: []string{"true"}, OutputLimit: agentOutputCap - 1}, "direct", agentOutputCap - 1, ""},
		{"utf-8 argv", ExecRequest{Argv: []string{"printf", "✓"}}, "direct", DefaultOutputLimit, ""},
		{"invalid utf-8 argv", ExecRequest{Argv: []string{"printf", "\xff"}}, "wrapper", DefaultOutputLimit, "JSON cannot carry it"},
		{"env", ExecRequest{Argv: []string{"env"}, Env: map[string]string{"A": "b"}}, "wrapper", DefaultOutputLimit, "env"},
		{"cwd", ExecRequest{Argv: []string{"pwd"}, Cwd: "/tmp"}, "wrapper", DefaultOutputLimit, "cwd"},
		{"user", ExecRequest{Argv: []string{"id"}, User: "nobody"}, "wrapper", DefaultOutputLimit, "user"},
		{"stdin", ExecRequest{Argv: []string{"cat"}, Stdin: strings.NewReader("x")}, "stream", 0, "stdin"},
		{"limit at the agent cap", ExecRequest{Argv: []string{"true"}, OutputLimit: agentOutputCap}, "stream", 0, "the agent cannot capture it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limit, fast := a.fastPlan(&tt.req)
			got := "stream"
			if fast {
				got = "wrapper"
				if directPlan(&tt.req) {
					got = "direct"
				}
			}
			if got != tt.path || (fast && limit != tt.limit) {
				t.Fatalf("path %s limit %d, want %s %d (%s)", got, limit, tt.path, tt.limit, tt.reason)
			}
		})
	}
}

// execAgent is a fake agent that answers guest-exec and guest-exec-status
// with what the test sets and records the programs it was asked to run.
type execAgent struct {
	*fakeAgent
	mu      sync.Mutex
	started []execCall
	refuse  map[string]bool // guest-exec of these paths fails like a missing program
	status  string          // the guest-exec-status return value of the command
	env     string          // the guest-exec-status return value of `env -0`
}

// execCall is one guest-exec the fake agent was asked for.
type execCall struct {
	path string
	env  []string // nil: none given
}

const (
	envPID = 7  // the fake pid of `env -0`
	cmdPID = 42 // the fake pid of anything else
)

func newExecAgent(t *testing.T, status string) *execAgent {
	e := &execAgent{fakeAgent: newFakeAgent(t), status: status, refuse: map[string]bool{},
		env: `{"exited": true, "exitcode": 0, "out-data": "` + base64.StdEncoding.EncodeToString([]byte("PATH=/bin\x00LANG=C\x00")) + `"}`}
	e.setHandler(func(c net.Conn, cmd string, id, args json.RawMessage) bool {
		switch cmd {
		case "guest-exec":
			var a struct {
				Path string   `json:"path"`
				Env  []string `json:"env"`
			}
			json.Unmarshal(args, &a)
			e.mu.Lock()
			e.started = append(e.started, execCall{a.Path, a.Env})
			refused := e.refuse[a.Path]
			e.mu.Unlock()
			pid := cmdPID
			switch {
			case refused:
				reply(c, `{"error": {"class": "GenericError", "desc": "Guest agent command failed, error was 'Failed to execute child process “`+a.Path+`” (No such file or directory)'"}, "id": `+string(id)+"}\n")
				return true
			case a.Path == envProgram:
				pid = envPID
			}
			reply(c, `{"return": {"pid": `+strconv.Itoa(pid)+`}, "id": `+string(id)+"}\n")
		case "guest-exec-status":
			var a struct {
				PID int `json:"pid"`
			}
			json.Unmarshal(args, &a)
			e.mu.Lock()
			st := e.status
			if a.PID == envPID {
				st = e.env
			}
			e.mu.Unlock()
			reply(c, `{"return": `+st+`, "id": `+string(id)+"}\n")
		default:
			return okHandler(c, cmd, id, nil)
		}
		return true
	})
	return e
}

// calls returns the guest-exec calls so far and forgets them.
func (e *execAgent) calls() []execCall {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.started
	e.started = nil
	return c
}

// paths is the programs of calls.
func paths(calls []execCall) []string {
	p := make([]string, len(calls))
	for i, c := range calls {
		p[i] = c.path
	}
	return p
}

var tagEntry = regexp.MustCompile(`^` + envTagName + `=[0-9a-f]{32}$`)

// TestExecDirectPathChoice: the direct exec reads the agent's environment
// once, then runs the command itself with that environment plus a fresh
// tag; when the environment is unusable it takes the setsid path, when the
// agent cannot start the program it retries through setsid (for 127/126),
// and without setsid it takes the wrapper's collected path.
func TestExecDirectPathChoice(t *testing.T) {
	t.Parallel()
	b64 := base64.StdEncoding.EncodeToString
	malformed := func(out string) string {
		return `{"exited": true, "exitcode": 0, "out-data": "` + b64([]byte(out)) + `"}`
	}
	tests := []struct {
		name   string
		env    string   // "" = the default good environment
		refuse []string // programs the agent cannot start
		first  []string // programs started by the first exec
		again  []string // by a second exec on the same client
		tagged bool     // the command got the agent's environment plus a tag
		own    bool     // Options.ExecOwnSession
	}{
		{name: "tagged", first: []string{envProgram, "x"}, again: []string{"x"}, tagged: true},
		{name: "no env program", refuse: []string{envProgram}, first: []string{envProgram, setsidPath}, again: []string{setsidPath}},
		{name: "env fails", env: `{"exited": true, "exitcode": 1}`, first: []string{envProgram, setsidPath}, again: []string{setsidPath}},
		{name: "env not NUL-terminated", env: malformed("A=1"), first: []string{envProgram, setsidPath}, again: []string{setsidPath}},
		{name: "env entry without =", env: malformed("A=1\x00B\x00"), first: []string{envProgram, setsidPath}, again: []string{setsidPath}},
		{name: "env bad base64", env: `{"exited": true, "exitcode": 0, "out-data": "!!"}`, first: []string{envProgram, setsidPath}, again: []string{setsidPath}},
		{name: "program not found", refuse: []string{"x"}, first: []string{envProgram, "x", setsidPath}, again: []string{"x", setsidPath}, tagged: true},
		{name: "program and setsid not found", refuse: []string{"x", setsidPath}, first: []string{envProgram, "x", setsidPath, "/bin/sh"}, again: []string{"x", setsidPath, "/bin/sh"}, tagged: true},
		{name: "own session: setsid, no environment read", own: true, first: []string{setsidPath}, again: []string{setsidPath}},
		{name: "own session without setsid: the wrapper", own: true, refuse: []string{setsidPath}, first: []string{setsidPath, "/bin/sh"}, again: []string{setsidPath, "/bin/sh"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newExecAgent(t, `{"exited": true, "exitcode": 0}`)
			if tt.env != "" {
				e.env = tt.env
			}
			for _, p := range tt.refuse {
				e.refuse[p] = true
			}
			opts := hostileOptions()
			opts.ExecOwnSession = tt.own
			a := New(opts).Agent(e.Socket)
			for i, want := range [][]string{tt.first, tt.again} {
				res, err := a.Exec(context.Background(), ExecRequest{Argv: []string{"x"}})
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("exec %d: got %+v, %v", i, res, err)
				}
				calls := e.calls()
				if got := paths(calls); !slices.Equal(got, want) {
					t.Fatalf("exec %d started %q, want %q", i, got, want)
				}
				for _, c := range calls {
					tagged := c.path == "x" && len(c.env) == 3 && c.env[0] == "PATH=/bin" && c.env[1] == "LANG=C" && tagEntry.MatchString(c.env[2])
					switch {
					case c.path == "x" && tt.tagged != tagged, c.path != "x" && c.env != nil:
						t.Fatalf("exec %d: %s got env %q", i, c.path, c.env)
					}
				}
			}
		})
	}
}

// TestAgentEnvCache: concurrent first execs on one socket read the agent's
// environment once; every exec gets a tag of its own.
func TestAgentEnvCache(t *testing.T) {
	t.Parallel()
	e := newExecAgent(t, `{"exited": true, "exitcode": 0}`)
	c := New(hostileOptions())
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Agent(e.Socket).Exec(context.Background(), ExecRequest{Argv: []string{"x"}}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	calls := e.calls()
	tags := map[string]bool{}
	envs := 0
	for _, call := range calls {
		if call.path == envProgram {
			envs++
			continue
		}
		tags[call.env[len(call.env)-1]] = true
	}
	if envs != 1 || len(tags) != 8 {
		t.Fatalf("%d env captures and %d distinct tags for 8 execs, want 1 and 8 (%q)", envs, len(tags), paths(calls))
	}
}

// TestParseAgentEnv: the agent's environment is accepted only as a strict
// list of NUL-terminated NAME=VALUE entries within the bounds.
func TestParseAgentEnv(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("A=1\x00", maxAgentEnvVars+1)
	tests := []struct {
		name string
		in   string
		want []string // nil = rejected
	}{
		{"empty", "", []string{}},
		{"two", "PATH=/usr/bin:/bin\x00LANG=C.UTF-8\x00", []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}},
		{"empty value and = in value", "A=\x00B=x=y\x00", []string{"A=", "B=x=y"}},
		{"duplicates kept in order", "A=1\x00A=2\x00", []string{"A=1", "A=2"}},
		{"newline in value", "A=a\nb\x00", []string{"A=a\nb"}},
		{"old tag dropped", "A=1\x00" + envTagName + "=abc\x00", []string{"A=1"}},
		{"not NUL-terminated", "A=1", nil},
		{"empty entry", "A=1\x00\x00", nil},
		{"no =", "A\x00", nil},
		{"empty name", "=x\x00", nil},
		{"invalid UTF-8", "A=\xff\x00", nil},
		{"too many entries", big, nil},
		{"too large", "A=" + strings.Repeat("x", maxAgentEnvBytes) + "\x00", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseAgentEnv([]byte(tt.in))
			if tt.want == nil {
				if !errors.Is(err, errAgentEnv) {
					t.Fatalf("got %q, %v; want errAgentEnv", got, err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestExecDirectReplies: the direct path's final status, as the agent
// sends it, becomes the result or a typed error.
func TestExecDirectReplies(t *testing.T) {
	t.Parallel()
	b64 := base64.StdEncoding.EncodeToString
	tests := []struct {
		name      string
		status    string
		limit     int64
		stdout    string
		stderr    string
		outTrunc  bool
		errTrunc  bool
		code, sig int
		kind      Kind // "" = success
	}{
		{name: "exit code", status: `{"exited": true, "exitcode": 3}`, code: 3},
		{name: "signal", status: `{"exited": true, "signal": 15}`, code: 143, sig: 15},
		{name: "binary output", status: `{"exited": true, "exitcode": 0, "out-data": "` + b64([]byte("\xff\x00\x01")) + `", "err-data": "` + b64([]byte("\x80e")) + `"}`, stdout: "\xff\x00\x01", stderr: "\x80e"},
		{name: "cut at the limit", status: `{"exited": true, "exitcode": 0, "out-data": "` + b64([]byte("0123456789")) + `"}`, limit: 4, stdout: "0123", outTrunc: true},
		{name: "exactly the limit", status: `{"exited": true, "exitcode": 0, "out-data": "` + b64([]byte("0123")) + `"}`, limit: 4, stdout: "0123"},
		{name: "agent truncated", status: `{"exited": true, "exitcode": 0, "err-data": "` + b64([]byte("ab")) + `", "err-truncated": true}`, stderr: "ab", errTrunc: true},
		{name: "exited without status", status: `{"exited": true}`, kind: KindMalformed},
		{name: "bad base64", status: `{"exited": true, "exitcode": 0, "out-data": "!!"}`, kind: KindMalformed},
		{name: "wrong type", status: `{"exited": "yes"}`, kind: KindMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newExecAgent(t, tt.status)
			res, err := New(hostileOptions()).Agent(e.Socket).Exec(context.Background(), ExecRequest{Argv: []string{"x"}, OutputLimit: tt.limit})
			if tt.kind != "" {
				var pe *ProtocolError
				if !errors.As(err, &pe) || pe.Kind != tt.kind {
					t.Fatalf("got %+v, %v; want a %s protocol error", res, err, tt.kind)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tt.code || res.Signal != tt.sig || string(res.Stdout) != tt.stdout || string(res.Stderr) != tt.stderr ||
				res.StdoutTruncated != tt.outTrunc || res.StderrTruncated != tt.errTrunc || res.StdoutBytes != int64(len(tt.stdout)) {
				t.Fatalf("got %+v", res)
			}
			if got := paths(e.calls()); !slices.Equal(got, []string{envProgram, "x"}) {
				t.Fatalf("started %q, want env, then the command itself", got)
			}
		})
	}
}
