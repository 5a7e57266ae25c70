package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// These tests hold the sandbox API to what a real Proxmox node does, as
// the emulator models it (testvm/pveemu/FIDELITY.md), with the
// /cluster/resources statistics lagging by default.

// rootCall sends one request to the emulator as root@pam (API token) and
// returns the HTTP status and the "message" or "data".
func (e *emuEnv) rootCall(t *testing.T, method, path string, form url.Values) (int, string) {
	t.Helper()
	id, secret, err := e.emu.RootToken(fmt.Sprintf("t%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	var body io.Reader
	u := e.url + path
	if method == "GET" || method == "DELETE" {
		u += "?" + form.Encode()
	} else {
		body = strings.NewReader(form.Encode())
	}
	req, _ := http.NewRequest(method, u, body)
	req.Header.Set("Authorization", "PVEAPIToken="+id+"="+secret)
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Data    any    `json:"data"`
		Message string `json:"message"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if out.Message != "" {
		return resp.StatusCode, out.Message
	}
	b, _ := json.Marshal(out.Data)
	return resp.StatusCode, string(b)
}

// TestEmulatorRollbackWithLaggingStats: after a rollback (which stops the
// VM), /cluster/resources still says "running" until the next statistics
// update; the VM must be running again and its agent back well before the
// agent timeout.
func TestEmulatorRollbackWithLaggingStats(t *testing.T) {
	e := newEmuEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.c.Snapshot(ctx, sb.ID, "vm0", "clean"); err != nil {
		t.Fatal(err)
	}
	e.emu.RefreshStats() // published: running
	// The agent timeout of this environment is 30 s: well inside it.
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	if err := e.c.Rollback(rctx, sb.ID, "vm0", "clean"); err != nil {
		t.Fatalf("rollback with stale statistics: %v", err)
	}
	if got := e.fb.Running(); len(got) != 1 {
		t.Fatalf("running after rollback: %v", got)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t, ctx)
}

// TestEmulatorDeleteJustStartedVM: statistics published while the VM was
// stopped, then it started (a second ago): the delete must still stop it
// before the destroy, which refuses a running VM.
func TestEmulatorDeleteJustStartedVM(t *testing.T) {
	e := newEmuEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	vmid := sb.VMs[0].VMID
	if err := e.px.StopVM(ctx, vmid); err != nil {
		t.Fatal(err)
	}
	e.emu.RefreshStats() // published: stopped
	if err := e.px.StartVM(ctx, vmid); err != nil {
		t.Fatal(err)
	}
	code, msg := e.rootCall(t, "GET", "/cluster/resources", url.Values{"type": {"vm"}})
	var rs []struct {
		VMID   int    `json:"vmid"`
		Status string `json:"status"`
	}
	_ = json.Unmarshal([]byte(msg), &rs)
	stale := false
	for _, r := range rs {
		stale = stale || (r.VMID == vmid && r.Status == "stopped")
	}
	if code != 200 || !stale {
		t.Fatalf("statistics are not stale: %d %s", code, msg)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatalf("delete of a VM started a moment ago: %v", err)
	}
	e.assertClean(t, ctx)
}

// TestEmulatorCleanupBeforeApply: a create that fails between vnet create
// and apply leaves vnets whose zone and alias are only under "pending";
// the teardown must still find and remove them, and the zone.
func TestEmulatorCleanupBeforeApply(t *testing.T) {
	var failed atomic.Bool
	e := newEmuEnvWith(t, emuSetup{wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/subnets") && !failed.Swap(true) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(500)
				_, _ = w.Write([]byte(`{"data":null,"message":"injected failure\n"}`))
				return
			}
			h.ServeHTTP(w, r)
		})
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("create with a failing subnet: %v", err)
	}
	e.assertClean(t, ctx)
	if code, msg := e.rootCall(t, "GET", "/cluster/sdn/zones", url.Values{"pending": {"1"}}); code != 200 || msg != "[]" {
		t.Fatalf("zones left: %d %s", code, msg)
	}
	if list, err := e.c.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("sandboxes left: %v %v", list, err)
	}
}

// TestEmulatorReloadWarningFailsCreate: a failed network reload only warns
// on the node (task "WARNINGS: 1"); the create must fail there, before any
// clone, and leave nothing.
func TestEmulatorReloadWarningFailsCreate(t *testing.T) {
	e := newEmuEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e.emu.InjectReloadWarning("reloading network config failed: ifreload -a: exit code 1")
	_, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err == nil || !strings.Contains(err.Error(), "WARNINGS: 1") || !strings.Contains(err.Error(), "ifreload -a: exit code 1") {
		t.Fatalf("create with a reload warning: %v", err)
	}
	for _, r := range e.emu.Requests() {
		if strings.HasSuffix(r.Path, "/clone") {
			t.Errorf("cloned although the apply failed: %s %s", r.Method, r.Path)
		}
	}
	e.assertClean(t, ctx)
	if code, msg := e.rootCall(t, "GET", "/cluster/sdn/zones", url.Values{"pending": {"1"}}); code != 200 || msg != "[]" {
		t.Fatalf("zones left: %d %s", code, msg)
	}
}

// TestEmulatorIPAMEntriesBlockSubnetDelete: the pve IPAM records the VMs'
// NICs; a leftover entry makes the subnet delete fail ("not empty"), and
// the teardown must clear it first.
func TestEmulatorIPAMEntriesBlockSubnetDelete(t *testing.T) {
	e := newEmuEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}, {Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	n := sb.Networks[0]
	// The gateway and one entry per VM NIC.
	if got := e.emu.IPAMEntries(sb.ID); len(got) != 3 {
		t.Fatalf("ipam after create: %v", got)
	}
	// A leftover reservation, as the reference plugin makes them.
	ip := strings.TrimSuffix(n.Gateway, ".1") + ".250"
	if code, msg := e.rootCall(t, "POST", "/cluster/sdn/vnets/"+n.VNet+"/ips", url.Values{"zone": {sb.ID}, "ip": {ip}, "mac": {"BC:24:11:AA:BB:CC"}}); code != 200 {
		t.Fatalf("add ip: %d %s", code, msg)
	}
	subnetID := sb.ID + "-" + strings.Replace(n.CIDR, "/", "-", 1)
	code, msg := e.rootCall(t, "DELETE", "/cluster/sdn/vnets/"+n.VNet+"/subnets/"+subnetID, nil)
	if code != 500 || msg != fmt.Sprintf("delete sdn subnet object failed: cannot delete subnet '%s', not empty\n", n.CIDR) {
		t.Fatalf("subnet delete with ipam entries: %d %q", code, msg)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatalf("teardown with a leftover ipam entry: %v", err)
	}
	e.assertClean(t, ctx)
	if got := e.emu.IPAMEntries(sb.ID); len(got) != 0 {
		t.Fatalf("ipam after delete: %v", got)
	}
}
