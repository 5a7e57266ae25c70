package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestEmulatorNoNetwork: a VM created with no_network, through the API
// against the emulator with the daemon's pool-scoped token and the
// hardened profile checked on every clone: its clone keeps no netN of its
// template (the configure deletes each, VM.Config.Network), so it starts
// without any NIC, and is in the hardened profile; the answer says
// no_network with its networks an empty list ("networks": [] on the wire)
// and no address, beside a VM on net0 with one. The containment check
// from it is refused (409 naming it; its exec: TestBedNoNetworkVM); a
// request with no_network and networks is refused, field named. The
// delete leaves nothing, and no request broke the official schema.
func TestEmulatorNoNetwork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newEmuEnvTB(t, withHardening(false))
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{
		{Name: "vault", Template: "debian", NoNetwork: true},
		{Name: "box", Template: "debian"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	vault, box := sb.VMs[0], sb.VMs[1]
	if sb.State != apitype.StateReady || !vault.NoNetwork || vault.Networks == nil || len(vault.Networks) != 0 || len(vault.Addresses) != 0 {
		t.Fatalf("sandbox %+v, want ready with vault of no NIC and no address", sb)
	}
	if box.NoNetwork || len(box.Networks) != 1 || len(box.Addresses) != 1 {
		t.Errorf("box %+v, want on net0 with an address", box)
	}
	conf, err := e.px.VMConfig(ctx, vault.VMID)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range conf {
		if strings.HasPrefix(k, "net") {
			t.Errorf("vault's clone has %s %q: want no NIC", k, v)
		}
	}
	if f := hardening.CheckFor(conf, hardening.Want{}).Failed(); len(f) != 0 {
		t.Errorf("vault not in the profile: %v", f)
	}
	if bc, err := e.px.VMConfig(ctx, box.VMID); err != nil || !strings.HasPrefix(bc["net0"], "virtio=") {
		t.Errorf("box's net0 %q (%v)", bc["net0"], err)
	}

	// the wire: "networks": [] and "no_network": true
	rec := httptest.NewRecorder()
	e.srv.LocalHandler().ServeHTTP(rec, httptest.NewRequestWithContext(ctx, "GET", "/v1/sandboxes/"+sb.ID, nil))
	var raw struct {
		VMs []map[string]json.RawMessage `json:"vms"`
	}
	err = json.NewDecoder(rec.Body).Decode(&raw)
	if err != nil || len(raw.VMs) != 2 || string(raw.VMs[0]["networks"]) != "[]" || string(raw.VMs[0]["no_network"]) != "true" || raw.VMs[1]["no_network"] != nil {
		t.Errorf("the answer's VMs %v (%v), want vault's networks [] and no_network true, box without it", raw.VMs, err)
	}

	var p *apitype.Problem
	if _, err := e.c.Check(ctx, sb.ID, "vault"); !errors.As(err, &p) || p.Status != 409 || !strings.Contains(p.Detail, "vm vault has no network") {
		t.Errorf("check from vault: %v, want 409 naming it", err)
	}
	_, err = e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", NoNetwork: true, Networks: []string{"net0"}}}})
	if !errors.As(err, &p) || p.Status != 400 || p.Field != "vms[0].no_network" {
		t.Errorf("no_network with networks: %v, want 400 of field vms[0].no_network", err)
	}

	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	vms, err := e.px.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vms {
		if !v.Template {
			t.Errorf("VM left: %+v", v)
		}
	}
	if v := e.emu.Violations(); len(v) != 0 {
		t.Errorf("schema violations: %+v", v)
	}
}
