package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall/mgmtport"
	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/pveapi/access"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu/emuguest"
)

// emuRootPassword is root@pam's password in the emulator.
const emuRootPassword = "emu-root-password"

type emuEnv struct {
	emu *pveemu.Server
	// url and hc reach the emulator's API directly (url ends in /api2/json).
	url string
	hc  *http.Client
	fb  *pveemu.FakeBackend
	px  *pveapi.Client
	srv *sandboxapi.Server
	c   *client.Client
	run string
	// tokenID is the daemon's token (ApplyAccessSetup's).
	tokenID string
}

// newEmuEnv runs the sandbox API against the Proxmox emulator (fake
// backend: no root) with the real guest agent client, authenticated with
// the privilege-separated API token pve-access-setup creates, holding
// exactly its roles and ACLs (pveemu.ApplyAccessSetup, from the
// pveapi/access table) and nothing broader.
func newEmuEnv(t *testing.T) *emuEnv { return newEmuEnvTB(t) }

func newEmuEnvTB(t testing.TB, opts ...func(*options)) *emuEnv {
	return newEmuEnvWith(t, emuSetup{opts: opts})
}

// emuSetup varies the emulator environment.
type emuSetup struct {
	// storages is pve-access-setup's PVE_INSPECTD_STORAGE (none: its
	// default, local-lvm, the template's disk); the transfer storage is
	// added to the pool either way.
	storages []string
	// wrap, when set, sits between the client and the emulator (fault
	// injection).
	wrap func(http.Handler) http.Handler
	// opts change the sandbox API's options.
	opts []func(*options)
	// reloadCost is the emulator's cost of a node's network reload.
	reloadCost pveemu.ReloadCost
	// recordPerms makes the emulator record its privilege checks from
	// its start (pveemu.Server.PermChecks).
	recordPerms bool
}

func newEmuEnvWith(t testing.TB, o emuSetup) *emuEnv {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	fb := pveemu.NewFakeBackend(run)
	emu, err := pveemu.New(pveemu.Options{Node: "pve", Backend: fb, DataDir: filepath.Join(dir, "data"), RootPassword: emuRootPassword,
		ReloadCost: o.reloadCost})
	if err != nil {
		t.Fatal(err)
	}
	if o.recordPerms {
		emu.RecordPermChecks()
	}
	var h http.Handler = emu
	if o.wrap != nil {
		h = o.wrap(emu)
	}
	ts := httptest.NewTLSServer(h)
	t.Cleanup(func() { ts.Close(); _ = emu.Close(); _ = fb.Close() })
	disk := filepath.Join(dir, "tdisk")
	_ = os.MkdirAll(filepath.Join(disk, "etc"), 0o755)
	_ = os.MkdirAll(filepath.Join(disk, "tmp"), 0o1777)
	_ = os.WriteFile(filepath.Join(disk, "etc", "motd"), []byte("template\n"), 0o644)
	ctx := context.Background()
	if err := emu.AddTemplate(ctx, 9000, "debian", disk, map[string]string{"net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0"}); err != nil {
		t.Fatal(err)
	}
	id, secret, err := emu.ApplyAccessSetup(pveemu.AccessSetup{Templates: []int{9000}, Storages: o.storages, Transfer: access.TransferStorage})
	if err != nil {
		t.Fatal(err)
	}
	px, err := pveapi.New(pveapi.Options{URL: ts.URL + "/api2/json", TokenID: id, Secret: secret, Node: "pve", HTTPClient: ts.Client(), TaskPoll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	so := options{Options: sandbox.Options{Node: "pve", Proxmox: px, Guests: socketGuests, QGADir: run,
		StateDir: filepath.Join(dir, "state"), AgentTimeout: 30 * time.Second, Logger: log, BridgeUp: fakeBridgeUp(fb), GatewayUp: fakeGatewayUp(fb)},
		serverOptions: sandboxapi.Options{Logger: log}}
	for _, f := range o.opts {
		f(&so)
	}
	srv, err := so.start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.LocalHandler())
	t.Cleanup(hs.Close)
	return &emuEnv{emu: emu, url: ts.URL + "/api2/json", hc: ts.Client(), fb: fb, px: px, srv: srv, c: client.New(hs.URL), run: run, tokenID: id}
}

// socketGuests is the fake backend's guest (emuguest).
var socketGuests sandbox.GuestDialer = emuguest.Dial

// rootClient is a Proxmox client of the emulator at url with a root token
// (the operator's, or another client's: not the daemon's pool token).
func rootClient(t *testing.T, emu *pveemu.Server, url string, hc *http.Client, name string) *pveapi.Client {
	t.Helper()
	return rootClientOn(t, emu, url, hc, name, "pve")
}

// rootClientOn is rootClient for node's API (a cluster's).
func rootClientOn(t *testing.T, emu *pveemu.Server, url string, hc *http.Client, name, node string) *pveapi.Client {
	t.Helper()
	rid, rsecret, err := emu.RootToken(name)
	if err != nil {
		t.Fatal(err)
	}
	root, err := pveapi.New(pveapi.Options{URL: url, TokenID: rid, Secret: rsecret, Node: node, HTTPClient: hc, TaskPoll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// fakeBridgeUp is Options.BridgeUp for the fake backend: a vnet's bridge
// is up when a zone the backend applied has it.
func fakeBridgeUp(fb *pveemu.FakeBackend) func(context.Context, string) (bool, error) {
	return func(_ context.Context, bridge string) (bool, error) {
		_, ok := fb.VNet(bridge)
		return ok, nil
	}
}

// fakeGatewayUp is Options.GatewayUp for the fake backend: the bridge is
// up with its subnet's gateway.
func fakeGatewayUp(fb *pveemu.FakeBackend) func(context.Context, string, netip.Addr) (bool, error) {
	return func(_ context.Context, bridge string, gw netip.Addr) (bool, error) {
		v, ok := fb.VNet(bridge)
		return ok && v.Gateway == gw, nil
	}
}

func TestEmulatorLifecycle(t *testing.T) {
	e := newEmuEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}, {Template: "debian", DiskGiB: 20}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.fb.Running(); len(got) != 2 {
		t.Errorf("running guests %v", got)
	}
	// The optional disk size reached Proxmox as a resize of the boot disk.
	resized := false
	for _, r := range e.emu.Requests() {
		if r.Method == "PUT" && strings.HasSuffix(r.Path, fmt.Sprintf("/qemu/%d/resize", sb.VMs[1].VMID)) {
			resized = true
		}
	}
	if !resized {
		t.Error("disk_gib 20 sent no resize")
	}
	if err := e.c.Snapshot(ctx, sb.ID, "vm1", "clean"); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Rollback(ctx, sb.ID, "vm1", "clean"); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t, ctx)
	if v := e.emu.Violations(); len(v) != 0 {
		t.Errorf("schema violations: %+v", v)
	}
	t.Logf("emulator requests for one 2-VM sandbox lifecycle (with reconcile): %d", len(e.emu.Requests()))
}

// assertClean checks the emulator holds no VM, vnet or zone of ours.
func (e *emuEnv) assertClean(t *testing.T, ctx context.Context) {
	t.Helper()
	vms, _ := e.px.ListVMs(ctx)
	for _, v := range vms {
		if !v.Template {
			t.Errorf("VM left: %+v", v)
		}
	}
	vnets, _ := e.px.ListVNets(ctx)
	if len(vnets) != 0 || len(e.fb.Zones()) != 0 || len(e.fb.Running()) != 0 {
		t.Errorf("left: vnets %v zones %v running %v", vnets, e.fb.Zones(), e.fb.Running())
	}
}

func TestEmulatorUnknownTemplateChangesNothing(t *testing.T) {
	e := newEmuEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "nosuch"}}})
	if !client.IsProblem(err, apitype.ProblemInvalidRequest) {
		t.Fatalf("unknown template: %v", err)
	}
	e.assertClean(t, ctx)
}

func TestEmulatorMgmtRules(t *testing.T) {
	e := newEmuEnv(t)
	conv := mgmtport.New(e.px, 8443, nil)
	ctx := context.Background()
	// The token may not turn the cluster firewall on: root does.
	if ch, err := conv.Converge(ctx, "mgmt0"); !errors.Is(err, mgmtport.ErrClusterFirewallOff) || !ch {
		t.Fatalf("converge with the cluster firewall off: %v %v", ch, err)
	}
	if err := e.px.SetClusterFirewall(ctx, true); err == nil {
		t.Fatal("the daemon's token turned the cluster firewall on")
	}
	if code, msg := e.rootCall(t, "PUT", "/cluster/firewall/options", url.Values{"enable": {"1"}}); code != 200 {
		t.Fatalf("root: cluster firewall on: %d %s", code, msg)
	}
	if ch, err := conv.Converge(ctx, "eth8"); err != nil || !ch {
		t.Fatalf("converge: %v %v", ch, err)
	}
	if ch, err := conv.Converge(ctx, "mgmt0"); err != nil || !ch {
		t.Fatalf("converge: %v %v", ch, err)
	}
	if ch, err := conv.Converge(ctx, "mgmt0"); err != nil || ch {
		t.Fatalf("second converge: %v %v", ch, err)
	}
	if ch, err := conv.Converge(ctx, "eth9"); err != nil || !ch {
		t.Fatalf("iface change: %v %v", ch, err)
	}
	rules, _ := e.px.NodeRules(ctx)
	if len(rules) != 9 || rules[0].Iface != "eth9" || rules[6].Type != "out" || rules[6].SPort != "8006" || rules[6].Iface != "eth9" {
		t.Errorf("rules %+v", rules)
	}
}

// TestEmulatorTokenACL uses the ACLs packaging/deb/pve-access-setup grants
// (as every test here does).
func TestEmulatorTokenACL(t *testing.T) {
	e := newEmuEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatalf("create with the pool-limited token: %v", err)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t, ctx)
}

// TestEmulatorCloneNeedsStorageGrant: a clone checks
// Datastore.AllocateSpace on /storage/<sid> of every disk, which the pool's
// ACL reaches only when the storage is a pool member; without it the
// create fails naming the privilege and leaves nothing.
func TestEmulatorCloneNeedsStorageGrant(t *testing.T) {
	e := newEmuEnvWith(t, emuSetup{storages: []string{"local"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err == nil || !strings.Contains(err.Error(), "403 Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)") {
		t.Fatalf("create without the storage grant: %v", err)
	}
	e.assertClean(t, ctx)
	if err := e.emu.AddPoolStorage("pve-inspect", "local-lvm"); err != nil {
		t.Fatal(err)
	}
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", DiskGiB: 12}}})
	if err != nil {
		t.Fatalf("create with the storage in the pool: %v", err)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t, ctx)
}
