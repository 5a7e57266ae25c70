package qga

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// bigStatusAgent answers guest-exec with a pid and every
// guest-exec-status with a reply of ~size bytes of base64 in out-data and
// err-data, exited or not: what a hostile agent may send whatever the
// request's output limit. The reply is written from bytes built once, so
// the agent allocates next to nothing per reply.
func bigStatusAgent(t *testing.T, exited bool, size int) *fakeAgent {
	f := newFakeAgent(t)
	data := bytes.Repeat([]byte("QUFB"), size/8)
	head := []byte(`{"return": {"exited": false, "out-data": "`)
	if exited {
		head = []byte(`{"return": {"exited": true, "exitcode": 0, "out-data": "`)
	}
	mid := []byte(`", "err-data": "`)
	f.setHandler(func(c net.Conn, cmd string, id, _ json.RawMessage) bool {
		switch cmd {
		case "guest-exec":
			reply(c, `{"return": {"pid": 42}, "id": `+string(id)+"}\n")
		case "guest-exec-status":
			for _, b := range [][]byte{head, data, mid, data, []byte(`"}, "id": ` + string(id) + "}\n")} {
				if _, err := c.Write(b); err != nil {
					return false
				}
			}
		default:
			return okHandler(c, cmd, id, nil)
		}
		return true
	})
	return f
}

// allocated runs fn and returns the bytes it allocated (the whole
// process's: the test is not parallel, so nothing else runs).
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestStatusReplyBounded: a hostile agent answers every status poll of a
// direct exec with OutputLimit 4096 with ~2x20 MB of output (the agent's
// capture cap, not the limit). A not-exited status carrying data is a
// protocol error at the first poll; an exited one yields the output cut at
// the limit. Either way the client allocates a bound derived from the
// limit (the kept bytes of a few replies), not from what the agent sent,
// and every buffered byte is back in the budget afterwards. On a8ba2b8 the
// client took each reply whole (45 MB) and polled on.
func TestStatusReplyBounded(t *testing.T) {
	const limit = 4096
	const size = 40 << 20 // base64 bytes of both streams: under directReplyBound
	bound := uint64(16 * (4*statusCut(limit) + replyOverhead + readSize))
	for _, tt := range []struct {
		name   string
		exited bool
	}{{"running with data", false}, {"exited with oversize data", true}} {
		t.Run(tt.name, func(t *testing.T) {
			f := bigStatusAgent(t, tt.exited, size)
			opts := hostileOptions()
			opts.ExecOwnSession = true // the setsid direct path: no environment capture
			opts.Budget = NewBudget(1<<20, 0)
			c := New(opts)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a client that polls on fails here
			defer cancel()
			var res *ExecResult
			var err error
			n := allocated(func() {
				res, err = c.Agent(f.Socket).Exec(ctx, ExecRequest{Argv: []string{"x"}, OutputLimit: limit})
			})
			t.Logf("allocated %d bytes (bound %d) for replies of %d bytes", n, bound, size)
			if n > bound {
				t.Errorf("allocated %d bytes for an output limit of %d, bound %d", n, limit, bound)
			}
			if tt.exited {
				if err != nil || len(res.Stdout) != limit || !res.StdoutTruncated || len(res.Stderr) != limit || !res.StderrTruncated ||
					!bytes.Equal(res.Stdout, bytes.Repeat([]byte("AAA"), limit/3+1)[:limit]) {
					t.Fatalf("exited: %v; want %d bytes of each stream, truncated", err, limit)
				}
			} else {
				var pe *ProtocolError
				if !errors.As(err, &pe) || pe.Kind != KindMalformed || !errors.Is(err, errDataWhileRunning) {
					t.Fatalf("running with data: %v, want a malformed-reply protocol error", err)
				}
			}
			if u := opts.Budget.Used(); u != 0 {
				t.Errorf("%d bytes still taken from the budget", u)
			}
			if p := opts.Budget.Peak(); p > int64(4*statusCut(limit)+replyOverhead+readSize) {
				t.Errorf("budget peak %d over one kept reply and the read buffer", p)
			}
		})
	}
}

// TestBudgetRefuses: a reply buffer that would pass the node-wide budget
// is refused with ErrBudget (not a protocol error: the guest did nothing
// wrong), the budget is whole again afterwards, and a Client sharing the
// budget sees the same bytes.
func TestBudgetRefuses(t *testing.T) {
	t.Parallel()
	f := newFakeAgent(t)
	f.setHandler(func(c net.Conn, cmd string, id, _ json.RawMessage) bool {
		switch cmd {
		case "guest-file-open":
			reply(c, `{"return": 1000, "id": `+string(id)+"}\n")
		case "guest-file-read":
			reply(c, `{"return": {"count": 3, "buf-b64": "QUFB", "eof": true}, "id": `+string(id)+"}\n")
		default:
			return okHandler(c, cmd, id, nil)
		}
		return true
	})
	b := NewBudget(minChunk, minChunk) // less than one chunk's reply; the share is the whole
	opts := hostileOptions()
	opts.Budget = b
	a, other := New(opts), New(opts)
	_, err := a.Agent(f.Socket).ReadFile(context.Background(), "/x", &strings.Builder{}, 0)
	var pe *ProtocolError
	if !errors.Is(err, ErrBudget) || errors.As(err, &pe) {
		t.Fatalf("read past the budget: %v, want ErrBudget", err)
	}
	if b.Used() != 0 || a.BufferedBytes() != 0 || other.BufferedBytes() != 0 {
		t.Fatalf("after the refusal: budget %d, buffered %d", b.Used(), a.BufferedBytes())
	}
	b = NewBudget(4<<20, 0)
	opts.Budget = b
	var got strings.Builder
	if _, err := New(opts).Agent(f.Socket).ReadFile(context.Background(), "/x", &got, 0); err != nil || got.String() != "AAA" {
		t.Fatalf("read within the budget: %q, %v", got.String(), err)
	}
	if b.Used() != 0 || b.Peak() == 0 {
		t.Fatalf("budget used %d peak %d", b.Used(), b.Peak())
	}
}

// TestCutter: every string is kept to max characters (an escape sequence
// is one), whatever the pieces the line arrives in; the rest is JSON as
// sent.
func TestCutter(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{`{"ab":"0123456789","c":true}`, `{"ab":"0123","c":true}`},
		{`{"a":"01\/3456"}`, `{"a":"01\/3"}`},
		{`{"a":"0\u00e9\"3456","b":"\\\\\\"}`, `{"a":"0\u00e9\"3","b":"\\\\\\"}`},
		{`{"a":"012\u00e9xyz"}`, `{"a":"012\u00e9"}`},
		{`{"a":"0123\u00e9xyz"}`, `{"a":"0123"}`},
		{`{"a":"0123\"xyz","b":1}`, `{"a":"0123","b":1}`},
	} {
		for _, piece := range []int{1, 3, len(tt.in)} {
			c := cutter{max: 4}
			var out []byte
			for in := []byte(tt.in); len(in) > 0; {
				n := min(piece, len(in))
				out = c.feed(out, in[:n])
				in = in[n:]
			}
			if string(out) != tt.want {
				t.Errorf("%s in pieces of %d: %s, want %s", tt.in, piece, out, tt.want)
			}
		}
	}
}

// TestBudgetShares: past its share an owner may take only from the part
// of the total that is not whole shares (1000 mod 300 = 100, shared by
// every owner), so a fourth owner still finds its share while three hold
// bytes; a buffer larger than that is refused for good; the total binds
// first; calls without an owner hold one share together, apart from every
// owner's (the owner "" too); giving back restores both.
func TestBudgetShares(t *testing.T) {
	t.Parallel()
	b := NewBudget(1000, 300)
	steps := []struct {
		owner string
		owned bool
		n     int64
		want  error
	}{
		{"a", true, 300, nil},
		{"a", true, 60, nil},             // 60 of the 100 past the shares
		{"b", true, 341, ErrOwnerBudget}, // a first buffer past what is left of them
		{"b", true, 340, nil},            // the other 40
		{"a", true, 1, ErrOwnerBudget},   // nothing left past the shares
		{"c", true, 300, nil},            // c's share is there
		{"", false, 1, ErrBudget},        // no owner: the total binds first
		{"a", true, -360, nil},           // a gives everything back
		{"d", true, 360, nil},            // the 60 a gave back, past d's share
		{"", true, 10, ErrBudget},        // "" is an owner like any other, the total binds
		{"c", true, -300, nil},           // c and b give back
		{"b", true, -340, nil},           //
		{"", false, 300, nil},            // no owner: a share of its own
		{"", false, 100, ErrOwnerBudget}, // ... and no more, d holds 60 past its share
		{"", true, 10, nil},              // the owner "" is not the calls of no owner
	}
	for i, s := range steps {
		if err := b.take(s.owner, s.owned, s.n); !errors.Is(err, s.want) || (s.want == nil) != (err == nil) {
			t.Fatalf("step %d %+v: %v, want %v", i, s, err, s.want)
		}
	}
	if u := b.Used(); u != 670 {
		t.Fatalf("used %d, want 670", u)
	}
}
