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
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// yesGuest streams output for `yes` until its context ends, like the
// real command under ExecStream.
type yesGuest struct{ sandbox.Guest }

func (g yesGuest) ExecStream(ctx context.Context, r sandbox.GuestExec, stdout, stderr io.Writer) (*apitype.ExecResult, error) {
	if len(r.Argv) == 0 || r.Argv[0] != "yes" {
		return g.Guest.ExecStream(ctx, r, stdout, stderr)
	}
	chunk := bytes.Repeat([]byte("y\n"), 32<<10)
	for ctx.Err() == nil {
		if _, err := stdout.Write(chunk); err != nil {
			return nil, err
		}
	}
	return nil, ctx.Err()
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
func TestStuckStreamClientDoesNotStallReaper(t *testing.T) {
	e, _, sb, tok := yesEnv(t, 2*time.Second, 0, 60) // TeardownTimeout 5 min in the daemon
	// A raw client that sends a streamed exec and never reads the answer.
	c := stall(t, e, streamedExec(sb.ID, tok), 0)
	defer c.Close()

	e.clock.Advance(2 * time.Minute)
	start := time.Now()
	n := e.srv.Engine().Reap(context.Background())
	took := time.Since(start)
	got, _ := e.srv.Engine().Get(sb.ID)
	t.Logf("reaper pass: %d deleted in %v; alice's sandbox is %q (%s)", n, took.Round(time.Millisecond), got.State, got.Error)
	if n != 1 || took >= 2*time.Second {
		t.Errorf("the reaper spent %v on a sandbox whose streamed exec's client stopped reading and did not delete it (state %q: %s)", took.Round(time.Millisecond), got.State, strings.TrimSpace(got.Error))
	}
}

// TestStuckClientDoesNotHoldDelete: a guest I/O call whose client stops
// reading the answer (a streamed exec, a file download) or stops sending
// the body (a file upload) ends as soon as the sandbox is deleted, so the
// delete does not wait out TeardownTimeout; and with no delete, each write
// or read is cut after Streams.WriteTimeout, ending the call by itself.
// Before, only the route's deadline (24 h for an exec, 30 min for a file)
// bounded them, and a delete waited for the call and failed.
func TestStuckClientDoesNotHoldDelete(t *testing.T) {
	const big = 32 << 20
	for _, tc := range []struct {
		name string
		// request sends the call and stops, holding the connection.
		request func(sb, tok string) string
		body    int // bytes of the body sent before the client stalls
	}{
		{"streamed exec", streamedExec, 0},
		{"file download", func(sb, tok string) string {
			return fmt.Sprintf("GET /v1/sandboxes/%s/vms/a/files?path=/big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", sb, tok)
		}, 0},
		{"file upload", func(sb, tok string) string {
			return fmt.Sprintf("PUT /v1/sandboxes/%s/vms/a/files?path=/up HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", sb, tok, big)
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
				e, ca, sb, tok := yesEnv(t, 3*time.Second, wt, 600)
				ctx := e.ctx()
				if err := ca.WriteFile(ctx, sb.ID, "a", "/big", bytes.NewReader(make([]byte, big)), big, 0o644); err != nil {
					t.Fatal(err)
				}
				c := stall(t, e, tc.request(sb.ID, tok), tc.body)
				defer c.Close()
				if !deleted {
					time.Sleep(2 * time.Second) // past the write timeout: the call ended
				}
				dctx, cancel := context.WithTimeout(context.Background(), 3*time.Second) // the route's: TeardownTimeout
				defer cancel()
				start := time.Now()
				err := e.srv.Engine().Delete(dctx, sb.ID)
				if took := time.Since(start); err != nil || took >= 2*time.Second {
					t.Errorf("delete took %v: %v (the call on the stalled connection held it)", took.Round(time.Millisecond), err)
				}
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
// with a small receive buffer that never reads the answer, and waits for
// the call to block on it (the buffers fill).
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

// yesEnv is an env whose guests answer a streamed `yes` (yesGuest), with
// the teardown and write timeouts given (0: the default), and alice's
// sandbox of one VM, a, with ttl seconds to live, and her admin token.
func yesEnv(t *testing.T, teardown, writeTimeout time.Duration, ttl int64) (*env, *client.Client, apitype.Sandbox, string) {
	t.Helper()
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	e := newEnv(t, func(o *options) {
		o.Tokens = store
		o.TeardownTimeout = teardown
		o.Streams.WriteTimeout = writeTimeout
		dial := o.Guests
		o.Guests = func(p string) sandbox.Guest { return yesGuest{dial(p)} }
	})
	tok, _, err := store.CreateOwned("a", "alice", []string{"admin"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ca := client.New(e.tcp.URL, client.WithToken(tok))
	sb, err := ca.Create(e.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "a", Template: "debian"}}, TTLSeconds: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return e, ca, sb, tok
}
