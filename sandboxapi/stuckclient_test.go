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
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	e := newEnv(t, func(o *options) {
		o.Tokens = store
		o.TeardownTimeout = 2 * time.Second // 5 min in the daemon
		dial := o.Guests
		o.Guests = func(p string) sandbox.Guest { return yesGuest{dial(p)} }
	})
	tok, _, err := store.CreateOwned("a", "alice", []string{"admin"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ctx := e.ctx()
	ca := client.New(e.tcp.URL, client.WithToken(tok))
	one := apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "a", Template: "debian"}}, TTLSeconds: 60}
	sb, err := ca.Create(ctx, one)
	if err != nil {
		t.Fatal(err)
	}
	// A raw client that sends a streamed exec and never reads the answer.
	u, _ := url.Parse(e.tcp.URL)
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	body, _ := json.Marshal(apitype.ExecRequest{Argv: []string{"yes"}, TimeoutSeconds: 86400})
	fmt.Fprintf(c, "POST /v1/sandboxes/%s/vms/a/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nAccept: application/x-ndjson\r\nContent-Length: %d\r\n\r\n%s", sb.ID, tok, len(body), body)
	time.Sleep(500 * time.Millisecond) // the buffers fill; the handler blocks in Write

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
