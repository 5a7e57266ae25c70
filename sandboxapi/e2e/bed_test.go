package e2e_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/containment"
	"github.com/pve-inspect/pve-inspect/containment/l2observe"
	"github.com/pve-inspect/pve-inspect/containment/probebuild"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/portmap"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/pveapi/access"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/testvm"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

type bedEnv struct {
	bed   *testvm.Bed
	emu   *pveemu.Server
	px    *pveapi.Client
	url   string
	hc    *http.Client
	opts  options
	srv   *sandboxapi.Server
	c     *client.Client
	close func()
}

// newBedEnv brings the bed, the emulator on it and the sandbox API up.
// serverOptions is the HTTP layer's options under a name of its own, so
// options can embed it beside the engine's.
type serverOptions = sandboxapi.Options

// options are a test server's engine and HTTP options in one struct: a
// field name is promoted from whichever has it (Logger is set on both).
type options struct {
	sandbox.Options
	serverOptions
}

// start builds the engine and the server and reconciles.
func (o options) start(ctx context.Context) (*sandboxapi.Server, error) {
	eng, err := sandbox.New(o.Options)
	if err != nil {
		return nil, err
	}
	srv, err := sandboxapi.New(eng, o.serverOptions)
	if err != nil {
		return nil, err
	}
	if _, err := eng.Reconcile(ctx); err != nil {
		return nil, err
	}
	return srv, nil
}

func newBedEnv(t testing.TB, ctx context.Context, mod func(*options)) *bedEnv {
	return newBedEnvWith(t, ctx, nil, mod)
}

// newBedEnvWith is newBedEnv with the emulator's backend passed through
// wrap (e.g. to inject faults).
func newBedEnvWith(t testing.TB, ctx context.Context, wrap func(pveemu.BedBackend) pveemu.Backend, mod func(*options)) *bedEnv {
	return newBedEnvFull(t, ctx, wrap, nil, mod)
}

// newBedEnvFull is newBedEnvWith with more templates: templates, when
// set, adds them to the emulator before the access setup and returns
// their ids (granted as pve-access-setup grants its templates).
func newBedEnvFull(t testing.TB, ctx context.Context, wrap func(pveemu.BedBackend) pveemu.Backend,
	templates func(*testvm.Bed, *pveemu.Server) []int, mod func(*options)) *bedEnv {
	bed, err := testvm.Up(ctx, testvm.Options{Logger: testkit.FailureLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bed.Close() })
	var backend pveemu.Backend = pveemu.BedBackend{Bed: bed}
	if wrap != nil {
		backend = wrap(pveemu.BedBackend{Bed: bed})
	}
	emu, err := pveemu.New(pveemu.Options{Node: "pve", Backend: backend, DataDir: filepath.Join(bed.Dir(), "pveemu")})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(emu)
	t.Cleanup(func() { ts.Close(); _ = emu.Close() })
	if err := emu.AddSandboxTemplate(ctx, 9000, filepath.Join(bed.Dir(), "template-disk"), ""); err != nil {
		t.Fatal(err)
	}
	tmpl := []int{9000}
	if templates != nil {
		tmpl = append(tmpl, templates(bed, emu)...)
	}
	// Exactly what packaging/deb/pve-access-setup creates.
	id, secret, err := emu.ApplyAccessSetup(pveemu.AccessSetup{Templates: tmpl, Transfer: access.TransferStorage})
	if err != nil {
		t.Fatal(err)
	}
	px, err := pveapi.New(pveapi.Options{URL: ts.URL + "/api2/json", TokenID: id, Secret: secret, Node: "pve", HTTPClient: ts.Client(), TaskPoll: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e := &bedEnv{bed: bed, emu: emu, px: px, url: ts.URL + "/api2/json", hc: ts.Client()}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	netSys, err := bed.NodeNetSys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.opts = options{
		Options: sandbox.Options{Node: "pve", Proxmox: px, Guests: qga.New(qga.Options{}).SandboxGuests(), QGADir: bed.QGADir(),
			StateDir: filepath.Join(bed.Dir(), "api-state"), AgentTimeout: 2 * time.Minute, Logger: log,
			BridgeUp: sandbox.SysfsBridgeUp(filepath.Join(netSys, "class", "net"))},
		serverOptions: sandboxapi.Options{MaxFileBytes: 128 << 20, Logger: log},
	}
	if mod != nil {
		mod(&e.opts)
	}
	e.start(t, ctx)
	return e
}

// bedChecker is the containment check as the bed's tests run it: the
// bed's addresses, metadata services, LAN host and public host; set its
// QGADir (and Observer, GuestPorts) once the bed is up.
func bedChecker(t *testing.T) *containment.SandboxChecker {
	return &containment.SandboxChecker{
		Runner: &containment.Runner{ProbePath: probebuild.ForTest(t), GuestDir: "/tmp"},
		Client: qga.New(qga.Options{}),
		Node: func(context.Context) (containment.Spec, containment.Policy, error) {
			return containment.Spec{
				HostAddrs:    []netip.Addr{netip.MustParseAddr(testvm.NodeMgmtAddr), netip.MustParseAddr(testvm.NodeMgmtAddr6)},
				ControlPorts: append(containment.DefaultControlPorts(), containment.Port{Port: 8443, Name: "sandbox API"}),
				Metadata: []netip.Addr{netip.MustParseAddr(testvm.MetadataAddr), netip.MustParseAddr(testvm.AlibabaMDAddr),
					netip.MustParseAddr(testvm.AzureWireAddr), netip.MustParseAddr(testvm.MetadataAddr6)},
				MetadataDNS:  []netip.Addr{netip.MustParseAddr(testvm.AWSDNSAddr)},
				LAN:          []netip.AddrPort{netip.MustParseAddrPort(testvm.LANAddr + ":80")},
				Public:       []netip.Addr{netip.MustParseAddr(testvm.InternetAddr)},
				Public6:      []netip.Addr{netip.MustParseAddr(testvm.InternetAddr6)},
				ExternalName: testvm.InternetName,
				Timeout:      2 * time.Second,
			}, containment.GuardPolicy(), nil
		},
		LocalName: testvm.LocalName,
	}
}

// runBedGuard starts the host guard in the bed's node namespace with its
// loop, as in the daemon (it learns the guest ports that join the zone
// bridges: the layer-2 table guards only those), and the port map; both
// stop when the test ends.
func runBedGuard(t *testing.T, ctx context.Context, e *bedEnv, node netns.NsHandle) *firewall.Guard {
	t.Helper()
	g, err := firewall.New(firewall.Config{DnsmasqUser: "dnsmasq", ProcRoot: t.TempDir(), StateDir: t.TempDir()}, firewall.WithNetNS(node))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- g.Run(rctx) }()
	t.Cleanup(func() { stopRun(); <-runDone })
	runPortMap(t, ctx, e.bed.NodeRoot(), g)
	return g
}

// guardHook hands a sandbox's zones to the host guard once it runs (the
// start's reconcile comes before the guard is up).
type guardHook struct {
	mu sync.Mutex
	g  *firewall.Guard // guarded by mu; nil until the guard runs
}

func (h *guardHook) zonesChanged(ctx context.Context, z map[string][]string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.g == nil {
		return nil
	}
	return h.g.SetZones(ctx, z)
}

// startCheckedGuard runs the guard in the bed's node namespace (runBedGuard)
// and points the containment check at the bed: its agent sockets, a
// layer-2 observer in the node namespace, the guard's port names. The hook
// hands zones to the guard from then on.
func startCheckedGuard(t *testing.T, ctx context.Context, e *bedEnv, chk *containment.SandboxChecker, hook *guardHook) *firewall.Guard {
	t.Helper()
	chk.QGADir = e.bed.QGADir()
	node, err := netns.GetFromName(e.bed.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	chk.Runner.Observer = l2observe.New(l2observe.WithNetNS(node))
	chk.GuestPorts = firewall.GuestPortNames
	chk.GuestAddrs = func(vmid int, zone string) ([]netip.Addr, error) {
		return portmap.Paths{Root: e.bed.NodeRoot()}.GuestAddrs(vmid, zone, time.Now())
	}
	g := runBedGuard(t, ctx, e, node)
	hook.mu.Lock()
	hook.g = g
	hook.mu.Unlock()
	return g
}

// newCheckedBedEnv is newBedEnv with the containment check and the host
// guard as the daemon runs them (startCheckedGuard): the guard learns
// every sandbox's zones from then on.
func newCheckedBedEnv(t *testing.T, ctx context.Context) (*bedEnv, *firewall.Guard) {
	t.Helper()
	hook := &guardHook{}
	chk := bedChecker(t)
	e := newBedEnv(t, ctx, func(o *options) {
		o.Checker = chk
		o.ZonesChanged = hook.zonesChanged
	})
	return e, startCheckedGuard(t, ctx, e, chk, hook)
}

// start (re)starts the API server on the same state dir.
func (e *bedEnv) start(t testing.TB, ctx context.Context) {
	if e.close != nil {
		e.close()
	}
	srv, err := e.opts.start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.LocalHandler())
	e.close = hs.Close
	t.Cleanup(hs.Close)
	e.srv, e.c = srv, client.New(hs.URL)
}

func TestBedAcceptance(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := newBedEnv(t, ctx, nil)
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}, {Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"uname", "-a"}})
	if err != nil || res.ExitCode != 0 || !strings.HasPrefix(string(res.Stdout), "Linux") {
		t.Fatalf("uname: %+v %v", res, err)
	}
	var out, errb bytes.Buffer
	res, err = e.c.ExecStream(ctx, sb.ID, "vm1", apitype.ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, &out, &errb)
	if err != nil || res.ExitCode != 3 || out.String() != "out\n" || errb.String() != "err\n" {
		t.Fatalf("stream: %+v %v %q %q", res, err, out.String(), errb.String())
	}
	data := make([]byte, 64<<20)
	_, _ = rand.Read(data)
	if err := e.c.WriteFile(ctx, sb.ID, "vm0", "/root/blob", bytes.NewReader(data), int64(len(data)), 0o600); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if _, err := e.c.ReadFile(ctx, sb.ID, "vm0", "/root/blob", &back); err != nil || sha256.Sum256(back.Bytes()) != sha256.Sum256(data) {
		t.Fatalf("64 MiB round trip: %v (%d bytes)", err, back.Len())
	}
	if err := e.c.WriteFile(ctx, sb.ID, "vm1", "/root/state", strings.NewReader("before\n"), -1, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Snapshot(ctx, sb.ID, "vm1", "clean"); err != nil {
		t.Fatal(err)
	}
	if err := e.c.WriteFile(ctx, sb.ID, "vm1", "/root/state", strings.NewReader("after\n"), -1, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Rollback(ctx, sb.ID, "vm1", "clean"); err != nil {
		t.Fatal(err)
	}
	res, err = e.c.Exec(ctx, sb.ID, "vm1", apitype.ExecRequest{Argv: []string{"cat", "/root/state"}})
	if err != nil || string(res.Stdout) != "before\n" {
		t.Fatalf("after rollback: %+v %v", res, err)
	}
	// restart mid-life: still usable; an orphan of ours is deleted, a
	// foreign VM is not touched (added through the emulator as root).
	root := rootClient(t, e.emu, e.url, e.hc, "e2e")
	for _, v := range []struct {
		id   int
		tags []string
		pool string
	}{{700, []string{"pvei-n-pve", "pvei-s-sbzzzzzz"}, "pve-inspect"}, {701, nil, ""}, {702, []string{"pvei-n-pve"}, "pve-inspect"}} {
		if err := root.CloneVM(ctx, sandbox.CloneSpec{Template: 9000, NewID: v.id, Name: fmt.Sprintf("extra%d", v.id), Pool: v.pool}); err != nil {
			t.Fatal(err)
		}
		if v.tags != nil {
			if err := root.ConfigureVM(ctx, v.id, sandbox.VMConfig{Tags: v.tags, Cores: 1, MemoryMiB: 512}); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.start(t, ctx)
	res, err = e.c.Exec(ctx, sb.ID, "vm1", apitype.ExecRequest{Argv: []string{"echo", "again"}})
	if err != nil || string(res.Stdout) != "again\n" {
		t.Fatalf("after restart: %+v %v", res, err)
	}
	if _, err := root.VM(ctx, 700); err == nil {
		t.Error("orphan VM with our tags survived the restart")
	}
	for _, id := range []int{701, 702} {
		if _, err := root.VM(ctx, id); err != nil {
			t.Errorf("VM %d without both tags was touched: %v", id, err)
		}
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	vms, _ := root.ListVMs(ctx)
	for _, v := range vms {
		if !v.Template && v.VMID != 701 && v.VMID != 702 {
			t.Errorf("VM left: %+v", v)
		}
	}
	vnets, _ := e.px.ListVNets(ctx)
	if len(vnets) != 0 {
		t.Errorf("vnets left: %+v", vnets)
	}
	for _, v := range sb.VMs {
		if _, ok := e.bed.Guest(v.VMID); ok {
			t.Errorf("guest %d still running on the bed", v.VMID)
		}
	}
	if v := e.emu.Violations(); len(v) != 0 {
		t.Errorf("schema violations: %+v", v)
	}
}

func TestBedConcurrentSandboxes(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	e := newBedEnv(t, ctx, nil)
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	ids := make([]string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
			if err != nil {
				errs[i] = err
				return
			}
			ids[i] = sb.ID
			for k := range 20 {
				// A small output limit: eight collected execs at the
				// default (10 MiB, reserving 20) would pass one owner's
				// 64 MiB share of the collected bytes (quota.go).
				res, err := e.c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"echo", fmt.Sprint(k)}, OutputLimit: 4096})
				if err != nil || string(res.Stdout) != fmt.Sprintf("%d\n", k) {
					errs[i] = fmt.Errorf("exec %d: %+v %v", k, res, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("sandbox %d: %v", i, err)
		}
	}
	for _, id := range ids {
		if id != "" {
			if err := e.c.Delete(ctx, id); err != nil {
				t.Error(err)
			}
		}
	}
}

func TestBedTTLAndGuard(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := newBedEnv(t, ctx, func(o *options) { o.ReaperInterval = time.Second; o.Caps.NodeVMs = 1 })
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	go e.srv.Engine().RunReaper(rctx)
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}, TTLSeconds: 5})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := e.px.ListVMs(ctx)
	_, err = e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	var p *apitype.Problem
	if !client.IsProblem(err, apitype.ProblemGuardRefused) || !asProblem(err, &p) || p.Cap != "node_vms" {
		t.Fatalf("over the cap: %v", err)
	}
	if after, _ := e.px.ListVMs(ctx); len(after) != len(before) {
		t.Errorf("refused create changed VMs: %d -> %d", len(before), len(after))
	}
	deadline := time.Now().Add(5*time.Second + 2*e.opts.ReaperInterval + 30*time.Second)
	for {
		if _, err := e.c.Get(ctx, sb.ID); client.IsProblem(err, apitype.ProblemNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("TTL sandbox not reaped")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func asProblem(err error, p **apitype.Problem) bool {
	q, ok := err.(*apitype.Problem)
	*p = q
	return ok
}

// logCheck logs a containment check's rows, with the detail of those
// that did not pass.
func logCheck(t *testing.T, rep apitype.CheckReport) {
	t.Helper()
	for _, r := range rep.Rows {
		t.Logf("%-40s %-50s expect %-9s observed %-9s pass %v", r.Target, r.Probe, r.Expected, r.Observed, r.Pass)
		if !r.Pass {
			t.Logf("    %s", r.Detail)
		}
	}
}

// waitGuarded waits until the layer-2 table guards the first NIC of VM
// vmid with a mapping (the port map learned it).
func waitGuarded(t *testing.T, g *firewall.Guard, vmid int) {
	t.Helper()
	waitGuardedPort(t, g, firewall.PortNames(vmid, 0)[0])
}

// waitGuardedPort waits until the layer-2 table guards port with a
// mapping.
func waitGuardedPort(t *testing.T, g *firewall.Guard, port string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !guardedPort(g, port) {
		if time.Now().After(deadline) {
			t.Fatalf("the layer-2 table does not guard %s with a mapping", port)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// guardedPort reports whether the layer-2 table guards port as a guest
// port with a mapping.
func guardedPort(g *firewall.Guard, port string) bool {
	rs := g.BridgeDesired()
	return rs != nil && slices.Contains(rs.Set(firewall.SetGuestPorts).Text, port) && !slices.Contains(g.UnmappedPorts(), port)
}

// runPortMap keeps the layer-2 guard's port map current from the bed's
// VM configs and leases (what the daemon's mapper does on a node) until
// the test ends.
func runPortMap(t *testing.T, ctx context.Context, root string, g *firewall.Guard) {
	t.Helper()
	m := &portmap.Mapper{Paths: portmap.Paths{Root: root}, Guard: g, Interval: 100 * time.Millisecond}
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(mctx) }()
	t.Cleanup(func() { stop(); <-done })
}

// TestBedCrossZoneIsolation: with the host guard in the node namespace and
// the API telling it the sandbox zones (ZonesChanged -> Guard.SetZones),
// a guest of one sandbox cannot reach a guest of another (checked from
// inside with the guest's own TCP stack); before the guard the same
// connect is answered (so the probe is not blind).
func TestBedCrossZoneIsolation(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var gmu sync.Mutex
	var guard *firewall.Guard
	e := newBedEnv(t, ctx, func(o *options) {
		o.ZonesChanged = func(ctx context.Context, z map[string][]string) error {
			gmu.Lock()
			defer gmu.Unlock()
			if guard == nil {
				return nil
			}
			return guard.SetZones(ctx, z)
		}
	})
	a, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	gb, ok := e.bed.Guest(b.VMs[0].VMID)
	if !ok {
		t.Fatal("guest of b not on the bed")
	}
	// exit 124: timed out (no route); anything else: something answered
	probe := func() int {
		res, err := e.c.Exec(ctx, a.ID, "vm0", apitype.ExecRequest{Argv: []string{"timeout", "3", "bash", "-c", "exec 3<>/dev/tcp/" + gb.IPv4().String() + "/22"}, TimeoutSeconds: 10})
		if err != nil {
			t.Fatal(err)
		}
		return res.ExitCode
	}
	if code := probe(); code == 124 {
		t.Fatalf("without the guard the other zone's guest did not answer (exit %d): the probe is blind", code)
	}
	node, err := netns.GetFromName(e.bed.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	g, err := firewall.New(firewall.Config{DnsmasqUser: "dnsmasq", ProcRoot: t.TempDir(), StateDir: t.TempDir()}, firewall.WithNetNS(node))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	runPortMap(t, ctx, e.bed.NodeRoot(), g)
	gmu.Lock()
	guard = g
	gmu.Unlock()
	// a third create publishes the zones to the guard
	c, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	if code := probe(); code != 124 {
		t.Errorf("with the guard a guest reached another sandbox's guest (exit %d)", code)
	}
	for _, id := range []string{a.ID, b.ID, c.ID} {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Error(err)
		}
	}
}

// TestBedContainmentCheck: POST /v1/sandboxes/{id}/check through the real
// probe in a sandbox VM on the bed with the host guard in force: every row
// passes under the guard policy (a control that fails would fail it),
// the layer-2 rows included, judged from the node's watch of the VM's
// vnet bridge.
func TestBedContainmentCheck(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e, g := newCheckedBedEnv(t, ctx)
	a, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	waitGuarded(t, g, a.VMs[0].VMID)
	rep, err := e.c.Check(ctx, a.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	logCheck(t, rep)
	otherZone, raw := false, 0
	for _, r := range rep.Rows {
		if strings.Contains(r.Probe, ":22") && !r.Control {
			otherZone = true
		}
		if strings.HasPrefix(r.Probe, "raw ") {
			raw++
		}
	}
	if raw != 4 {
		t.Errorf("%d layer-2 rows (control included), want 4", raw)
	}
	if !rep.Pass || len(rep.Rows) < 10 {
		t.Errorf("containment check did not pass (%d rows)", len(rep.Rows))
	}
	if !otherZone {
		t.Error("no row probes the other sandbox's guest")
	}
	for _, id := range []string{a.ID, b.ID} {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Error(err)
		}
	}
}
