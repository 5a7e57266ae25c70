package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestCreateSurvivesALostReload: another client's SDN apply (another
// node's daemon, an operator) is reloading the node when the create's
// apply comes; the create's reload is lost (ifupdown2's lock does not
// wait) and its task still ends OK. The create sees its vnet's bridge
// missing, applies again once the other reload is done, and its VM
// starts on the bridge (issue 36 item 2).
func TestCreateSurvivesALostReload(t *testing.T) {
	e := newEmuEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	other := rootClient(t, e.emu, e.url, e.hc, "other-client")
	held, release := e.emu.HoldReloads()
	defer release()
	otherDone := make(chan error, 1)
	go func() { otherDone <- other.ApplySDN(ctx) }()
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the other client's reload never started")
	}
	go func() { time.Sleep(1500 * time.Millisecond); release() }()
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatalf("create while another client's reload ran: %v", err)
	}
	if err := <-otherDone; err != nil {
		t.Fatal(err)
	}
	if got, err := e.c.Get(ctx, sb.ID); err != nil || got.State != apitype.StateReady {
		t.Fatalf("sandbox: %+v %v", got, err)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t, ctx)
}
