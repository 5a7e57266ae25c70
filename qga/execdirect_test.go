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
}

// execCall is one guest-exec the fake agent was asked for.
type execCall struct {
	path string
	env  []string // nil: none given
}

// cmdPID is the fake pid of every command.
const cmdPID = 42

func newExecAgent(t *testing.T, status string) *execAgent {
	e := &execAgent{fakeAgent: newFakeAgent(t), status: status, refuse: map[string]bool{}}
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
			if refused {
				reply(c, `{"error": {"class": "GenericError", "desc": "Guest agent command failed, error was 'Failed to execute child process “`+a.Path+`” (No such file or directory)'"}, "id": `+string(id)+"}\n")
				return true
			}
			reply(c, `{"return": {"pid": `+strconv.Itoa(cmdPID)+`}, "id": `+string(id)+"}\n")
		case "guest-exec-status":
			e.mu.Lock()
			st := e.status
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

// TestExecDirectPathChoice: the direct exec runs the command itself with
// BaseEnv plus a fresh tag and reads nothing from the guest first; when
// the agent cannot start the program it retries through setsid (for
// 127/126), and without setsid it takes the wrapper's collected path.
// Every guest-exec carries a whole environment: the tagged command
// BaseEnv and its tag, everything else BaseEnv.
func TestExecDirectPathChoice(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		refuse []string // programs the agent cannot start
		want   []string // programs started by each exec
		tagged bool     // the command got BaseEnv plus a tag
		own    bool     // Options.ExecOwnSession
	}{
		{name: "tagged", want: []string{"x"}, tagged: true},
		{name: "program not found", refuse: []string{"x"}, want: []string{"x", setsidPath}, tagged: true},
		{name: "program and setsid not found", refuse: []string{"x", setsidPath}, want: []string{"x", setsidPath, "/bin/sh"}, tagged: true},
		{name: "own session: setsid", own: true, want: []string{setsidPath}},
		{name: "own session without setsid: the wrapper", own: true, refuse: []string{setsidPath}, want: []string{setsidPath, "/bin/sh"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newExecAgent(t, `{"exited": true, "exitcode": 0}`)
			for _, p := range tt.refuse {
				e.refuse[p] = true
			}
			opts := hostileOptions()
			opts.ExecOwnSession = tt.own
			a := New(opts).Agent(e.Socket)
			for i := range 2 {
				res, err := a.Exec(context.Background(), ExecRequest{Argv: []string{"x"}})
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("exec %d: got %+v, %v", i, res, err)
				}
				calls := e.calls()
				if got := paths(calls); !slices.Equal(got, tt.want) {
					t.Fatalf("exec %d started %q, want %q", i, got, tt.want)
				}
				for _, c := range calls {
					base := BaseEnv()
					tagged := c.path == "x" && len(c.env) == len(base)+1 && slices.Equal(c.env[:len(base)], base) && tagEntry.MatchString(c.env[len(base)])
					switch {
					case c.path == "x" && tt.tagged != tagged, c.path != "x" && !slices.Equal(c.env, base):
						t.Fatalf("exec %d: %s got env %q", i, c.path, c.env)
					}
				}
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
			if got := paths(e.calls()); !slices.Equal(got, []string{"x"}) {
				t.Fatalf("started %q, want the command itself", got)
			}
		})
	}
}
