package qga

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestExecDoneBeforeItsDeadlineIsNotKilled: a command whose status says it
// exited is never killed and never reported as timed out, however late the
// poll that saw it came. Each path used to send its kill on reaching the
// deadline before it asked the status, so a command that ended between
// its last poll and the deadline came back TimedOut (a CI run's
// containment probe was "killed" this way after its report was ready).
func TestExecDoneBeforeItsDeadlineIsNotKilled(t *testing.T) {
	t.Parallel()
	f := newFakeAgent(t)
	var mu sync.Mutex
	var kills int
	f.setHandler(func(c net.Conn, cmd string, id, args json.RawMessage) bool {
		switch cmd {
		case "guest-file-open":
			reply(c, `{"return": 1000, "id": `+string(id)+"}\n")
		case "guest-exec":
			if strings.Contains(string(args), "pve-inspect-kill") {
				mu.Lock()
				kills++
				mu.Unlock()
			}
			reply(c, `{"return": {"pid": 42}, "id": `+string(id)+"}\n")
		case "guest-exec-status":
			reply(c, `{"return": {"exited": true, "exitcode": 0}, "id": `+string(id)+"}\n")
		case "guest-file-read":
			reply(c, `{"return": {"count": 0, "buf-b64": "", "eof": true}, "id": `+string(id)+"}\n")
		default:
			return okHandler(c, cmd, id, nil)
		}
		return true
	})
	a := New(hostileOptions()).Agent(f.Socket)
	for _, p := range []struct {
		name string
		exec func(ctx context.Context, r ExecRequest) (*ExecResult, error)
	}{
		{"stream", func(ctx context.Context, r ExecRequest) (*ExecResult, error) { return a.ExecStream(ctx, r, nil, nil) }},
		{"wrapper", func(ctx context.Context, r ExecRequest) (*ExecResult, error) {
			limit, _ := a.fastPlan(&r)
			return a.execFast(ctx, &r, limit)
		}},
		{"direct", func(ctx context.Context, r ExecRequest) (*ExecResult, error) { return a.Exec(ctx, r) }},
	} {
		t.Run(p.name, func(t *testing.T) {
			mu.Lock()
			kills = 0
			mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// A deadline already passed when the first status is asked.
			res, err := p.exec(ctx, ExecRequest{Argv: []string{"true"}, Timeout: time.Nanosecond})
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if res.TimedOut || res.ExitCode != 0 || kills != 0 {
				t.Fatalf("timed out %v, exit %d, %d kills: want a command that exited, never killed", res.TimedOut, res.ExitCode, kills)
			}
		})
	}
}
