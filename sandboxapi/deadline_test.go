package sandboxapi_test

import (
	"context"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// slowDelete is the fake Proxmox whose VM delete takes a second.
type slowDelete struct{ *apitest.Proxmox }

func (p slowDelete) DeleteVM(ctx context.Context, id int) error {
	select {
	case <-time.After(time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	return p.Proxmox.DeleteVM(ctx, id)
}

// TestCallOutlivesTheBodyDeadline: a call without a body that runs past
// RequestTimeout (the body's read deadline) goes on to its answer. The
// deadline used to stay on the connection, and net/http's background read
// of it (started at once for a call without a body, to see the client
// go) timed out there and cancelled the request's context: in CI a delete
// that ran past a minute answered 500 "context canceled" (schemathesis
// ST101). The exec, whose JSON body the decoder never reads to its end,
// never started that read and ran on.
func TestCallOutlivesTheBodyDeadline(t *testing.T) {
	e := newEnv(t, func(o *options) {
		o.RequestTimeout = 300 * time.Millisecond
		o.Proxmox = slowDelete{o.Proxmox.(*apitest.Proxmox)}
	})
	sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	res, err := e.c.Exec(e.ctx(), sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"sleep"}, TimeoutSeconds: 1})
	if err != nil || !res.TimedOut {
		t.Fatalf("an exec running past RequestTimeout: %+v, %v", res, err)
	}
	start := time.Now()
	if err := e.c.Delete(e.ctx(), sb.ID); err != nil {
		t.Fatalf("a delete running past RequestTimeout: %v (after %v)", err, time.Since(start))
	}
	if _, ok := e.px.VMByID(sb.VMs[0].VMID); ok {
		t.Error("the VM is still there")
	}
}
