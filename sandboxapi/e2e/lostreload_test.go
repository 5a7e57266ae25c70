package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
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

// TestApplyOutlastsTheTeardownBound: on a cluster of many DHCP zones an
// SDN apply takes longer than a teardown's bound (each node's reload
// restarts every zone's dnsmasq; issue 36 item 10). A create and a delete
// wait for their apply (up to ApplyTimeout) instead of giving it up at
// TeardownTimeout, which failed the create, left its teardown's own apply
// cut short and the sandbox in error.
func TestApplyOutlastsTheTeardownBound(t *testing.T) {
	e := newEmuEnvWith(t, emuSetup{
		reloadCost: pveemu.ReloadCost{PerNode: 1500 * time.Millisecond},
		opts:       []func(*options){func(o *options) { o.TeardownTimeout = 300 * time.Millisecond }},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatalf("create whose apply outlasts the teardown bound: %v", err)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatalf("delete whose apply outlasts the teardown bound: %v", err)
	}
	e.assertClean(t, ctx)
}
