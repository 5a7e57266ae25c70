package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// TestAPISharedVNetCheckedAtStart: [api] shared_vnets naming a vnet
// Proxmox does not have keeps the API answering 503 `unavailable` with the
// reason (the key and the vnet named) and retrying; once the operator has
// made the vnet with a subnet, the API reconciles and answers healthy.
func TestAPISharedVNetCheckedAtStart(t *testing.T) {
	bed := newPVEBed(t)
	bed.up(t)
	cfg := bed.config(t, t.TempDir())
	cfg.API.SharedVNets = []string{"lab"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	api, err := NewAPI(cfg, slog.New(slog.DiscardHandler), APIDeps{Guests: apitest.NewGuests().Dial, RetryMin: 20 * time.Millisecond, RetryMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- api.Run(rctx) }()
	c := client.NewUnix(cfg.API.Socket)
	waitFor(t, "503 naming the vnet", func() error {
		_, err := c.Health(ctx)
		if client.IsProblem(err, apitype.ProblemUnavailable) && strings.Contains(err.Error(), "shared_vnets: vnet lab is not a vnet") {
			return nil
		}
		return fmt.Errorf("got %v", err)
	})
	rid, rsecret, err := bed.emu.RootToken("operator")
	if err != nil {
		t.Fatal(err)
	}
	root, err := pveapi.New(pveapi.Options{URL: "http://" + bed.addr + "/api2/json", TokenID: rid, Secret: rsecret, Node: "pve", TaskPoll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() error{
		func() error { return root.CreateZone(ctx, sandbox.ZoneSpec{ID: "opzone"}) },
		func() error { return root.CreateVNet(ctx, sandbox.VNetSpec{ID: "lab", Zone: "opzone"}) },
		func() error {
			return root.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "lab", CIDR: "10.88.0.0/24", Gateway: "10.88.0.1",
				DHCPRanges: []apitype.DHCPRange{{Start: "10.88.0.10", End: "10.88.0.200"}}})
		},
		func() error { return root.ApplySDN(ctx) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "healthy once the vnet exists", func() error {
		h, err := c.Health(ctx)
		if err == nil && h.Status != "ok" {
			err = fmt.Errorf("status %q", h.Status)
		}
		return err
	})
	rcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
