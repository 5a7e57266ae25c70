package qga

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// hostileOptions keeps the memory bounds small so that the memory bound
// is easy to check, and the time bounds generous: the fake agents of a
// test, hostile or not, answer at once, and a call that has to wait for
// one on a loaded machine must not end as a timeout. A test whose agent
// never answers gives the call that waits for it short bounds of its own
// (stallingOptions).
func hostileOptions() Options {
	return Options{
		StallTimeout:  time.Minute,
		CallTimeout:   time.Minute,
		DrainTimeout:  200 * time.Millisecond,
		MaxChunk:      minChunk,
		MaxReplyBytes: 256 << 10,
	}
}

// stallingOptions is hostileOptions with short time bounds, for a client
// whose call waits for an agent that stalls or trickles: that agent never
// completes its reply, so the bound ends the call whatever the load, and
// the test stays quick.
func stallingOptions() Options {
	o := hostileOptions()
	o.StallTimeout, o.CallTimeout = 300*time.Millisecond, 2*time.Second
	return o
}

// patient gives c, whose last call had stallingOptions' short time bounds
// to run into, hostileOptions' generous ones for the calls that check it
// still works. A Client holds nothing between calls but its per-VM locks
// and buffer counts, which stay as they are: the calls after it check
// those, not how fast a loaded machine answers.
func patient(c *Client) {
	h := hostileOptions()
	c.opts.StallTimeout, c.opts.CallTimeout = h.StallTimeout, h.CallTimeout
}

// flood writes s forever until the connection breaks.
func flood(c net.Conn, s string) {
	b := []byte(strings.Repeat(s, 64<<10/len(s)+1))
	for {
		if _, err := c.Write(b); err != nil {
			return
		}
	}
}

func TestHostileAgent(t *testing.T) {
	t.Parallel()
	type handler = func(c net.Conn, cmd string, id, args json.RawMessage) bool
	// A stalling agent keeps reading until the client hangs up.
	stall := func(c net.Conn) { io.Copy(io.Discard, c) }
	// A case of kind KindTimeout never completes its reply (it stalls or
	// trickles): its call runs with stallingOptions, and the calls after
	// it with hostileOptions' bounds (patient). Every other case's agent
	// sends what decides its kind at once, so no time bound ends its call
	// on a loaded machine.
	tests := []struct {
		name    string
		handler handler
		sync    func(c net.Conn, id json.RawMessage) bool
		kind    Kind
	}{
		{name: "malformed json", kind: KindMalformed, handler: func(c net.Conn, _ string, id, _ json.RawMessage) bool {
			reply(c, `{"return": {"x": }, "id": `+string(id)+"}\n")
			return true
		}},
		{name: "not an object", kind: KindMalformed, handler: func(c net.Conn, _ string, _, _ json.RawMessage) bool {
			reply(c, "[1,2,3]\n")
			return true
		}},
		{name: "neither return nor error", kind: KindMalformed, handler: func(c net.Conn, _ string, id, _ json.RawMessage) bool {
			reply(c, `{"id": `+string(id)+"}\n")
			return true
		}},
		{name: "wrong return type", kind: KindMalformed, handler: func(c net.Conn, _ string, id, _ json.RawMessage) bool {
			reply(c, `{"return": {"version": 7}, "id": `+string(id)+"}\n")
			return true
		}},
		{name: "wrong id", kind: KindWrongID, handler: func(c net.Conn, _ string, _, _ json.RawMessage) bool {
			reply(c, `{"return": {}, "id": 123456789}`+"\n")
			return true
		}},
		{name: "unsolicited reply", kind: KindUnsolicited, handler: func(c net.Conn, _ string, id, _ json.RawMessage) bool {
			reply(c, `{"return": {}}`+"\n"+`{"return": {}, "id": `+string(id)+"}\n")
			return true
		}},
		{name: "sync answers another id", kind: KindWrongID, sync: func(c net.Conn, _ json.RawMessage) bool {
			for range 10 {
				reply(c, "\xff{\"return\": 4242424}\n")
			}
			return true
		}},
		{name: "garbage before sync", kind: KindUnsolicited, sync: func(c net.Conn, _ json.RawMessage) bool {
			go flood(c, "garbage ")
			return true
		}},
		{name: "garbage before sync past what a request of ours could leave", kind: KindUnsolicited, sync: func(c net.Conn, id json.RawMessage) bool {
			reply(c, "{\"error\": {\"class\": \"GenericError\", \"desc\": \"JSON parse error, stray '"+strings.Repeat("A", 300<<10)+"'\"}}\n")
			reply(c, "\xff{\"return\": "+string(id)+"}\n")
			return true
		}},
		{name: "garbage before sync past the bound, the delimiter in the same write", kind: KindUnsolicited, sync: func(c net.Conn, id json.RawMessage) bool {
			reply(c, strings.Repeat("A", 300<<10)+"\xff{\"return\": "+string(id)+"}\n")
			return true
		}},
		{name: "stalled reply", kind: KindTimeout, handler: func(c net.Conn, _ string, _, _ json.RawMessage) bool {
			reply(c, `{"return": {"vers`)
			stall(c)
			return false
		}},
		{name: "stalled sync", kind: KindTimeout, sync: func(c net.Conn, _ json.RawMessage) bool {
			stall(c)
			return false
		}},
		{name: "trickle", kind: KindTimeout, handler: func(c net.Conn, _ string, _, _ json.RawMessage) bool {
			reply(c, `{"return": "`)
			for {
				time.Sleep(50 * time.Millisecond)
				if _, err := c.Write([]byte("A")); err != nil {
					return false
				}
			}
		}},
		{name: "gigabyte reply", kind: KindTooLarge, handler: func(c net.Conn, _ string, _, _ json.RawMessage) bool {
			reply(c, `{"return": "`)
			flood(c, "AAAAAAAA")
			return false
		}},
		{name: "gigabyte reply to sync", kind: KindTooLarge, sync: func(c net.Conn, _ json.RawMessage) bool {
			reply(c, "\xff{\"return\": ")
			flood(c, "11111111")
			return false
		}},
		{name: "closed mid reply", kind: KindClosed, handler: func(c net.Conn, _ string, _, _ json.RawMessage) bool {
			reply(c, `{"return": {"ver`)
			return false
		}},
		{name: "closed before reply", kind: KindClosed, handler: func(net.Conn, string, json.RawMessage, json.RawMessage) bool {
			return false
		}},
		{name: "closed before sync", kind: KindClosed, sync: func(net.Conn, json.RawMessage) bool {
			return false
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bad := newFakeAgent(t)
			good := newFakeAgent(t)
			good.setHandler(infoHandler)
			if tt.handler != nil {
				bad.setHandler(tt.handler)
			} else {
				bad.setHandler(infoHandler)
			}
			bad.setSync(tt.sync)
			opts := hostileOptions()
			if tt.kind == KindTimeout {
				opts = stallingOptions()
			}
			c := New(opts)
			// past CallTimeout: a call that never ends is a wrong kind,
			// not this deadline
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()

			_, err := c.Agent(bad.Socket).Info(ctx)
			patient(c)
			var pe *ProtocolError
			if !errors.As(err, &pe) {
				t.Fatalf("Info on misbehaving agent: got %v (%T), want *ProtocolError", err, err)
			}
			if pe.Kind != tt.kind {
				t.Fatalf("kind %q, want %q (%v)", pe.Kind, tt.kind, err)
			}
			if pe.Socket != bad.Socket {
				t.Errorf("error names socket %q, want %q", pe.Socket, bad.Socket)
			}
			bound := int64(c.Options().MaxReplyBytes + readSize)
			if p := c.PeakBufferedBytes(); p > bound {
				t.Errorf("peak buffered %d bytes, bound %d", p, bound)
			}
			if n := c.BufferedBytes(); n != 0 {
				t.Errorf("%d bytes still buffered after the call", n)
			}
			// The same client works for another VM, and for this one once
			// it behaves.
			if _, err := c.Agent(good.Socket).Info(ctx); err != nil {
				t.Fatalf("Info on good agent after failure: %v", err)
			}
			bad.setHandler(infoHandler)
			bad.setSync(nil)
			if in, err := c.Agent(bad.Socket).Info(ctx); err != nil || in.Version != "fake" {
				t.Fatalf("Info on the recovered agent: %+v, %v", in, err)
			}
		})
	}
}

// TestSyncDiscardsAnEarlierWritesEcho: a file write cancelled mid-chunk
// leaves its partial request in qemu-ga's parser across clients, and the
// next client's 0xFF makes qemu-ga answer a parse error that echoes it
// whole (seen with qemu-ga 7.2: 2 MiB for a cut 2 MiB write) before the
// sync's delimiter; the client discards up to what its largest request
// could leave (MaxReplyBytes), and the call goes on. It failed as
// unsolicited output past 64 KiB before.
func TestSyncDiscardsAnEarlierWritesEcho(t *testing.T) {
	t.Parallel()
	f := newFakeAgent(t)
	f.setHandler(infoHandler)
	f.setSync(func(c net.Conn, id json.RawMessage) bool {
		reply(c, `{"error": {"class": "GenericError", "desc": "JSON parse error, stray '`+strings.Repeat("A", 200<<10)+`'"}}`+"\n")
		reply(c, "\xff{\"return\": "+string(id)+"}\n")
		return true
	})
	c := New(hostileOptions()) // MaxReplyBytes 256 KiB
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if in, err := c.Agent(f.Socket).Info(ctx); err != nil || in.Version != "fake" {
		t.Fatalf("Info after 200 KiB of an earlier write's echo: %+v, %v", in, err)
	}
}

func infoHandler(c net.Conn, cmd string, id, _ json.RawMessage) bool {
	if cmd == "guest-info" {
		reply(c, `{"return": {"version": "fake", "supported_commands": []}, "id": `+string(id)+"}\n")
		return true
	}
	return okHandler(c, cmd, id, nil)
}

func TestAgentErrorMapping(t *testing.T) {
	t.Parallel()
	tests := []struct {
		desc string
		want error
	}{
		{"failed to open file '/x/y' (mode: 'r'): No such file or directory", ErrNotFound},
		{"failed to open file '/etc/passwd/x' (mode: 'r'): Not a directory", ErrNotFound},
		{"failed to read file: Is a directory", ErrIsDir},
		{"failed to open file '/root/x' (mode: 'r'): Permission denied", ErrPermission},
	}
	for _, tt := range tests {
		t.Run(tt.desc, func(t *testing.T) {
			f := newFakeAgent(t)
			f.setHandler(func(c net.Conn, cmd string, id, _ json.RawMessage) bool {
				switch cmd {
				case "guest-file-open":
					if strings.Contains(tt.desc, "read file") {
						reply(c, `{"return": 1000, "id": `+string(id)+"}\n")
						return true
					}
				case "guest-file-close":
					return okHandler(c, cmd, id, nil)
				}
				b, _ := json.Marshal(map[string]any{"error": map[string]string{"class": "GenericError", "desc": tt.desc}, "id": json.RawMessage(id)})
				reply(c, string(b)+"\n")
				return true
			})
			c := New(hostileOptions())
			_, err := c.Agent(f.Socket).ReadFile(context.Background(), "/some/file", discard{}, 0)
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			var ae *AgentError
			if !errors.As(err, &ae) {
				t.Fatalf("got %T, want an *AgentError inside", err)
			}
			var pe *PathError
			if !errors.As(err, &pe) || pe.Path != "/some/file" {
				t.Fatalf("got %v, want *PathError for /some/file", err)
			}
		})
	}
}

type discard struct{}

func (discard) Write(b []byte) (int, error) { return len(b), nil }

// TestSerializedPerVMParallelAcross: one VM never sees two connections at
// once, a blocked VM does not block another, and a caller waiting for a
// busy VM gives up when its context ends.
func TestSerializedPerVMParallelAcross(t *testing.T) {
	t.Parallel()
	slow, other := newFakeAgent(t), newFakeAgent(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 16)
	slow.setHandler(func(c net.Conn, cmd string, id, _ json.RawMessage) bool {
		entered <- struct{}{}
		<-release
		return okHandler(c, cmd, id, nil)
	})
	c := New(Options{})
	ctx := context.Background()

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- c.Agent(slow.Socket).Ping(ctx) }()
	}
	<-entered // one ping is inside the slow agent, the others wait for the VM lock

	if err := c.Agent(other.Socket).Ping(ctx); err != nil {
		t.Fatalf("other VM blocked by a busy one: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err := c.Agent(slow.Socket).Ping(short)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting for a busy VM: got %v, want deadline exceeded", err)
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if m := slow.maxActive.Load(); m != 1 {
		t.Fatalf("agent saw %d concurrent connections, want 1", m)
	}
	if n := slow.conns.Load(); n != 4 {
		t.Fatalf("agent saw %d connections, want 4 (one per command sequence)", n)
	}
}

// TestCancelMidCall: a call abandoned by its context returns the context's
// error promptly (the connection is closed) and the next call works.
func TestCancelMidCall(t *testing.T) {
	t.Parallel()
	f := newFakeAgent(t)
	hold := make(chan struct{})
	f.setHandler(func(c net.Conn, cmd string, id, _ json.RawMessage) bool {
		<-hold
		return okHandler(c, cmd, id, nil)
	})
	c := New(Options{DrainTimeout: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	err := c.Agent(f.Socket).Ping(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	close(hold)
	f.setHandler(okHandler)
	if err := c.Agent(f.Socket).Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestInvalidRequests(t *testing.T) {
	t.Parallel()
	f := newFakeAgent(t)
	a := New(Options{}).Agent(f.Socket)
	ctx := context.Background()
	execs := []ExecRequest{
		{},
		{Argv: []string{""}},
		{Argv: []string{"a\x00b"}},
		{Argv: []string{"env"}, Env: map[string]string{"A=B": "x"}},
		{Argv: []string{"env"}, Env: map[string]string{"1A": "x"}},
		{Argv: []string{"env"}, Cwd: "/tmp\x00"},
		{Argv: []string{"env"}, Timeout: -1},
	}
	for _, r := range execs {
		if _, err := a.Exec(ctx, r); !errors.Is(err, ErrInvalid) {
			t.Errorf("Exec(%+v): got %v, want ErrInvalid", r, err)
		}
	}
	for _, p := range []string{"", "rel/path", "/a/../b", "/a//b", "/a\x00", "/\xff", "/"} {
		if err := a.WriteFile(ctx, p, strings.NewReader("x"), 0o644); !errors.Is(err, ErrInvalid) {
			t.Errorf("WriteFile(%q): got %v, want ErrInvalid", p, err)
		}
		if p != "/" {
			if _, err := a.ReadFile(ctx, p, discard{}, 0); !errors.Is(err, ErrInvalid) {
				t.Errorf("ReadFile(%q): got %v, want ErrInvalid", p, err)
			}
		}
	}
	if err := a.WriteFile(ctx, "/x", strings.NewReader("x"), 0o4755|1<<20); !errors.Is(err, ErrInvalid) {
		t.Errorf("WriteFile with type bits: got %v, want ErrInvalid", err)
	}
	if n := f.conns.Load(); n != 0 {
		t.Fatalf("invalid requests reached the agent (%d connections)", n)
	}
}

// TestHostileFileReplies: file replies that lie about their size or never
// reach EOF end in a protocol error, not a loop or an overrun.
func TestHostileFileReplies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		read string
	}{
		{"empty read without eof", `{"count": 0, "buf-b64": "", "eof": false}`},
		{"count disagrees with data", `{"count": 10, "buf-b64": "aGVsbG8=", "eof": true}`},
		{"more than asked", `{"count": 5, "buf-b64": "aGVsbG8=", "eof": true}`},
		{"bad base64", `{"count": 5, "buf-b64": "!!!!", "eof": true}`},
		{"data is not a string", `{"count": 5, "buf-b64": 5, "eof": true}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAgent(t)
			f.setHandler(func(c net.Conn, cmd string, id, _ json.RawMessage) bool {
				switch cmd {
				case "guest-file-open":
					reply(c, `{"return": 1000, "id": `+string(id)+"}\n")
				case "guest-file-read":
					reply(c, `{"return": `+tt.read+`, "id": `+string(id)+"}\n")
				default:
					return okHandler(c, cmd, id, nil)
				}
				return true
			})
			opts := hostileOptions()
			if tt.name == "more than asked" {
				opts.MaxChunk = minChunk
			}
			c := New(opts)
			var got strings.Builder
			limit := int64(0)
			if tt.name == "more than asked" {
				limit = 3 // asks for 4 bytes, gets 5
			}
			_, err := c.Agent(f.Socket).ReadFile(context.Background(), "/f", &got, limit)
			var pe *ProtocolError
			if !errors.As(err, &pe) || pe.Kind != KindMalformed {
				t.Fatalf("got %v, want a malformed-reply protocol error", err)
			}
			if got.Len() != 0 {
				t.Fatalf("%d bytes of a rejected reply reached the writer", got.Len())
			}
		})
	}
}

func TestErrorKind(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want string
	}{
		{nil, ""},
		{&PathError{Op: "read", Path: "/x", Err: &ProtocolError{Kind: KindTimeout}}, "timeout"},
		{&PathError{Op: "read", Path: "/x", Err: &AgentError{Desc: "No such file or directory"}}, "agent"},
		{ErrInvalid, "invalid"},
		{context.Canceled, "canceled"},
		{context.DeadlineExceeded, "deadline"},
		{io.EOF, "other"},
	}
	for _, tt := range tests {
		if got := ErrorKind(tt.err); got != tt.want {
			t.Errorf("ErrorKind(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

// TestAgentWithoutIDs: an agent older than QEMU 3.0 does not echo ids; the
// option accepts that, and a wrong id is still refused.
func TestAgentWithoutIDs(t *testing.T) {
	t.Parallel()
	f := newFakeAgent(t)
	f.setHandler(func(c net.Conn, cmd string, _, _ json.RawMessage) bool {
		reply(c, `{"return": {"version": "2.5.0", "supported_commands": []}}`+"\n")
		return true
	})
	opts := hostileOptions()
	opts.AcceptReplyWithoutID = true
	in, err := New(opts).Agent(f.Socket).Info(context.Background())
	if err != nil || in.Version != "2.5.0" {
		t.Fatalf("old agent: %+v, %v", in, err)
	}
	f.setHandler(func(c net.Conn, cmd string, _, _ json.RawMessage) bool {
		reply(c, `{"return": {}, "id": 7777777}`+"\n")
		return true
	})
	var pe *ProtocolError
	if _, err := New(opts).Agent(f.Socket).Info(context.Background()); !errors.As(err, &pe) || pe.Kind != KindWrongID {
		t.Fatalf("wrong id with AcceptReplyWithoutID: %v", err)
	}
}

// TestHostileExecStatus: an exec status that says exited without a code or
// signal is a protocol error, and the exec's guest files are still cleaned
// up (handles closed).
func TestHostileExecStatus(t *testing.T) {
	t.Parallel()
	f := newFakeAgent(t)
	var mu sync.Mutex
	closed := map[string]bool{}
	f.setHandler(func(c net.Conn, cmd string, id, args json.RawMessage) bool {
		switch cmd {
		case "guest-file-open":
			reply(c, `{"return": 1000, "id": `+string(id)+"}\n")
		case "guest-exec":
			reply(c, `{"return": {"pid": 42}, "id": `+string(id)+"}\n")
		case "guest-exec-status":
			reply(c, `{"return": {"exited": true}, "id": `+string(id)+"}\n")
		case "guest-file-close":
			mu.Lock()
			closed[string(args)] = true
			mu.Unlock()
			return okHandler(c, cmd, id, nil)
		default:
			return okHandler(c, cmd, id, nil)
		}
		return true
	})
	_, err := New(hostileOptions()).Agent(f.Socket).ExecStream(context.Background(), ExecRequest{Argv: []string{"true"}}, nil, nil)
	var pe *ProtocolError
	if !errors.As(err, &pe) || pe.Kind != KindMalformed {
		t.Fatalf("got %v, want a malformed-reply protocol error", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !closed[`{"handle":1000}`] {
		t.Fatalf("output handles not closed: %v", closed)
	}
}
