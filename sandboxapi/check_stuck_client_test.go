package sandboxapi_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// bigReportChecker answers every check with an ordinary report of rows
// (a node with a few dozen sandboxes and LAN targets: ~30 KB).
type bigReportChecker struct{ rows int }

func (c bigReportChecker) Run(ctx context.Context, t sandbox.CheckTarget) (apitype.CheckReport, error) {
	rep := apitype.CheckReport{Pass: true}
	for i := range c.rows {
		rep.Rows = append(rep.Rows, apitype.CheckRow{Target: fmt.Sprintf("other zone guest 10.%d.%d.2", i/256, i%256),
			Probe: "10.0.0.2:22", Expected: "blocked", Observed: "blocked", Pass: true, Detail: "no answer within 3s"})
	}
	return rep, nil
}

// TestCheckStuckClientDoesNotHoldDelete: POST .../check computes its
// report inside the operation Begin started and writes it after the
// operation has ended. A client that pipelines checks and never reads the
// answers holds only its own connection: the sandbox's delete does not
// wait TeardownTimeout for the stalled report write. TeardownTimeout is
// a minute, so that a slow machine cannot fail the delete; a report
// written inside the operation holds it past that and fails it.
func TestCheckStuckClientDoesNotHoldDelete(t *testing.T) {
	store := auth.Open(filepath.Join(t.TempDir(), "tokens.json"))
	e := newEnv(t, func(o *options) {
		o.Tokens = store
		o.TeardownTimeout = time.Minute
		o.Streams.WriteTimeout = time.Second
		o.Checker = bigReportChecker{rows: 200}
	})
	tok, _, err := store.CreateOwned("m", "mallory", []string{"admin"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cm := client.New(e.tcp.URL, client.WithToken(tok))
	sb, err := cm.Create(e.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "a", Template: "debian"}}, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	// HTTP/1.1 pipelining: the answers of the earlier checks fill the
	// socket's buffers (the client never reads), so a later check blocks
	// in writeJSON inside its operation, whatever the report's size.
	req := strings.Repeat(fmt.Sprintf("POST /v1/sandboxes/%s/check HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 0\r\n\r\n", sb.ID, tok), 400)
	c := stall(t, e, req, 0)
	defer c.Close()
	time.Sleep(1500 * time.Millisecond) // past Streams.WriteTimeout: a guarded write would have ended
	dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := e.srv.Engine().Delete(dctx, sb.ID); err != nil {
		t.Errorf("delete: %v (the check's report write on the stalled connection held the operation)", err)
	}
}
