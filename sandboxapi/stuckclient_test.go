package sandboxapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// bigFile is the size of /big in a stuckGuest, and of the upload a
// stalled client starts: far more than a connection's buffers hold.
const bigFile = 32 << 20

// The routes of the guest I/O calls a client stalls.
const (
	routeExec     = "POST /v1/sandboxes/{id}/vms/{vm}/exec"
	routeDownload = "GET /v1/sandboxes/{id}/vms/{vm}/files"
	routeUpload   = "PUT /v1/sandboxes/{id}/vms/{vm}/files"
)

// stuckGuest is a guest whose streamed `yes` writes its output until a
// write fails, never looking at its context: like the real call blocked
// in a Write to a client that stopped reading, it ends only when the
// daemon cuts the connection's write (a delete's abort, the write
// timeout), whenever the delete comes. Its /big holds bigFile bytes. It
// counts the guest I/O calls it is handed: a call counted there has begun
// its operation on the sandbox.
type stuckGuest struct{ countedGuest }

func (g stuckGuest) ExecStream(ctx context.Context, r sandbox.GuestExec, stdout, stderr io.Writer) (*apitype.ExecResult, error) {
	if len(r.Argv) == 0 || r.Argv[0] != "yes" {
		return g.countedGuest.ExecStream(ctx, r, stdout, stderr)
	}
	g.calls.Add(1)
	chunk := bytes.Repeat([]byte("y\n"), 32<<10)
	for {
		if _, err := stdout.Write(chunk); err != nil {
			return nil, err
		}
	}
}

func (g stuckGuest) ReadFile(ctx context.Context, path string, w io.Writer, max int64) (int64, error) {
	if path != "/big" {
		return g.countedGuest.ReadFile(ctx, path, w, max)
	}
	g.calls.Add(1)
	n, err := w.Write(make([]byte, bigFile))
	return int64(n), err
}

// stuckEnv is an env whose guests are stuckGuests, alice's sandbox of one
// VM, a, and her admin token.
type stuckEnv struct {
	*env
	sb  apitype.Sandbox
	tok string
	// begun counts the guest I/O calls the guests were handed.
	begun atomic.Int64
	// answered is how many calls of the stalled call's route were
	// answered before it was sent (stuckCall).
	answered float64
}

// TestStuckStreamClientDoesNotStallReaper (from review1): a streamed
// exec whose client stops reading blocked in the response's Write (the
// exec route's write deadline is 24 h + 60 s; a delete's cancellation
// does not unblock a Write). The operation never ends, so the delete of that sandbox waits
// for it for TeardownTimeout (5 min) and fails; the reaper does the
// expired sandboxes one after another, so every pass spends
// TeardownTimeout per such sandbox before (or after) every other owner's
// expired sandbox, and the stuck one is due again next pass (state
// error). One owner with k sandboxes holds the node's reaper for k x 5
// min a pass, every pass, for a day. Now: a streamed write with a short
// deadline of its own (like the events' WriteTimeout), so a delete ends
// the call, and the reaper not serialised behind one sandbox.
//
// What it proves, with no clock: the stuck exec is in its operation and
// unanswered when the pass starts, and nothing but the delete can end it
// (the guest ignores its context, Streams.WriteTimeout is an hour); the
// pass deletes the sandbox within TeardownTimeout, a minute, and the
// exec's call then ends. A delete that waited for the call would run
// into TeardownTimeout and fail: the pass would delete nothing.
func TestStuckStreamClientDoesNotStallReaper(t *testing.T) {
	e := newStuckEnv(t, time.Hour, 60)
	c := e.stuckCall(t, routeExec, streamedExec(e.sb.ID, e.tok), 0)
	defer c.Close()

	e.clock.Advance(2 * time.Minute)
	n := e.srv.Engine().Reap(context.Background())
	got, left := e.srv.Engine().Get(e.sb.ID)
	if n != 1 || left {
		t.Fatalf("the reaper deleted %d of 1 expired sandboxes; the one whose streamed exec's client stopped reading is %q (%s)", n, got.State, strings.TrimSpace(got.Error))
	}
	e.waitEnded(t, routeExec, "the stuck exec ending after the reaper deleted its sandbox")
}

// TestStuckClientDoesNotHoldDelete: a guest I/O call whose client stops
// reading the answer (a streamed exec, a file download) or stops sending
// the body (a file upload) ends as soon as the sandbox is deleted, so the
// delete does not wait out TeardownTimeout; and with no delete, each write
// or read is cut after Streams.WriteTimeout, ending the call by itself.
// Before, only the route's deadline (24 h for an exec, 30 min for a file)
// bounded them, and a delete waited for the call and failed.
//
// What it proves, with no clock: "cut by a delete": the call has begun
// its operation and is unanswered when the delete starts, and only the
// delete can end it (the guest ignores its context, WriteTimeout is an
// hour); the delete succeeds within TeardownTimeout, a minute, and the
// call ends. A delete held by the call would fail at TeardownTimeout.
// "cut by its write timeout": with WriteTimeout a second, the call ends
// by itself, with no delete, within a minute, where the route's deadline
// (30 min, 24 h) would hold it; the delete then succeeds.
func TestStuckClientDoesNotHoldDelete(t *testing.T) {
	for _, tc := range []struct {
		name  string
		route string
		// request sends the call and stops, holding the connection.
		request func(sb, tok string) string
		body    int // bytes of the body sent before the client stalls
	}{
		{"streamed exec", routeExec, streamedExec, 0},
		{"file download", routeDownload, func(sb, tok string) string {
			return fmt.Sprintf("GET /v1/sandboxes/%s/vms/a/files?path=/big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", sb, tok)
		}, 0},
		{"file upload", routeUpload, func(sb, tok string) string {
			return fmt.Sprintf("PUT /v1/sandboxes/%s/vms/a/files?path=/up HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", sb, tok, bigFile)
		}, 1 << 20},
	} {
		for _, deleted := range []bool{true, false} {
			name := tc.name + ", cut by its write timeout"
			if deleted {
				name = tc.name + ", cut by a delete"
			}
			t.Run(name, func(t *testing.T) {
				wt := time.Hour
				if !deleted {
					wt = time.Second
				}
				e := newStuckEnv(t, wt, 600)
				c := e.stuckCall(t, tc.route, tc.request(e.sb.ID, e.tok), tc.body)
				defer c.Close()
				if !deleted {
					e.waitEnded(t, tc.route, "the stalled call ending by its write timeout, with no delete")
				}
				dctx, cancel := context.WithTimeout(context.Background(), time.Minute) // the route's: TeardownTimeout
				defer cancel()
				if err := e.srv.Engine().Delete(dctx, e.sb.ID); err != nil {
					t.Fatalf("delete: %v (the call on the stalled connection held it)", err)
				}
				e.waitEnded(t, tc.route, "the stalled call ending after the delete")
			})
		}
	}
}

// streamedExec is the request of a streamed `yes` on VM a of sandbox sb.
func streamedExec(sb, tok string) string {
	body, _ := json.Marshal(apitype.ExecRequest{Argv: []string{"yes"}, TimeoutSeconds: 86400})
	return fmt.Sprintf("POST /v1/sandboxes/%s/vms/a/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nAccept: application/x-ndjson\r\nContent-Length: %d\r\n\r\n%s", sb, tok, len(body), body)
}

// stall sends request and body bytes of its body on a raw connection
// with a small receive buffer that never reads the answer, and gives the
// call a moment to block on it (the buffers fill).
func stall(t *testing.T, e *env, request string, body int) net.Conn {
	t.Helper()
	u, _ := url.Parse(e.tcp.URL)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	fmt.Fprint(c, request)
	if body > 0 {
		_, _ = c.Write(make([]byte, body))
	}
	time.Sleep(500 * time.Millisecond)
	return c
}

// stuckCall stalls request (stall) and waits, up to a minute, until the
// call has reached the guest: it holds an operation on the sandbox. It
// fails the test when the call was already answered.
func (e *stuckEnv) stuckCall(t *testing.T, route, request string, body int) net.Conn {
	t.Helper()
	before := e.begun.Load()
	e.answered = e.handled(route)
	c := stall(t, e.env, request, body)
	waitUntil(t, "the stalled call reaching the guest", func() bool { return e.begun.Load() > before })
	if e.handled(route) != e.answered {
		t.Fatalf("the stalled %s call was answered already", route)
	}
	return c
}

// waitEnded waits, up to a minute, until the stalled call of route was
// answered (its handler returned), and fails the test with what
// otherwise.
func (e *stuckEnv) waitEnded(t *testing.T, route, what string) {
	t.Helper()
	waitUntil(t, what, func() bool { return e.handled(route) > e.answered })
}

// handled counts the answered requests of route, every status code.
func (e *stuckEnv) handled(route string) float64 {
	var n float64
	for k, v := range testkit.Series(e.t, e.reg, map[string]string{"route": route}) {
		if strings.HasPrefix(k, "pve_inspect_api_requests_total{") {
			n += v
		}
	}
	return n
}

// waitUntil polls cond for up to a minute (something that must happen:
// a slow machine only makes it later) and fails the test when it never
// held.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
	}
}

// newStuckEnv is a stuckEnv with TeardownTimeout a minute, the write
// timeout given, and alice's sandbox with ttl seconds to live.
func newStuckEnv(t *testing.T, writeTimeout time.Duration, ttl int64) *stuckEnv {
	t.Helper()
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	se := &stuckEnv{}
	se.env = newEnv(t, func(o *options) {
		o.Tokens = store
		o.TeardownTimeout = time.Minute
		o.Streams.WriteTimeout = writeTimeout
		dial := o.Guests
		o.Guests = func(p string) sandbox.Guest {
			return stuckGuest{countedGuest{Guest: dial(p), calls: &se.begun}}
		}
	})
	tok, _, err := store.CreateOwned("a", "alice", []string{"admin"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ca := client.New(se.tcp.URL, client.WithToken(tok))
	sb, err := ca.Create(se.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "a", Template: "debian"}}, TTLSeconds: ttl})
	if err != nil {
		t.Fatal(err)
	}
	se.sb, se.tok = sb, tok
	return se
}
