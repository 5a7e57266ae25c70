package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/containment/probebuild"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/portmap"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/testvm"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// bedNeighbour is a host on the node's management network that only the
// node's ARP table knows (a permanent entry the test adds): discovery must
// find it without configuration.
const bedNeighbour = "192.0.2.77"

// checkBed is the test bed with the Proxmox emulator on it and the sandbox
// API serving the daemon's own containment check (newChecker, default
// config: no [check] lan targets) in the bed's node namespace.
type checkBed struct {
	bed   *testvm.Bed
	c     *client.Client
	node  netns.NsHandle
	mu    sync.Mutex      // guards guard
	guard *firewall.Guard // set once the guard runs; zones go to it
}

func upCheckBed(t *testing.T, ctx context.Context) *checkBed {
	t.Helper()
	bed, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Close(); err != nil {
			t.Errorf("bed close: %v", err)
		}
	})
	if out, err := bed.Command(ctx, bed.NodeNS(), "ip", "neigh", "add", bedNeighbour, "lladdr", "02:00:00:00:00:77",
		"dev", testvm.NodeMgmtIface, "nud", "permanent").CombinedOutput(); err != nil {
		t.Fatalf("add the neighbour: %v: %s", err, out)
	}
	node, err := netns.GetFromName(bed.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	emu, err := pveemu.New(pveemu.Options{Node: "pve", Backend: pveemu.BedBackend{Bed: bed}, DataDir: filepath.Join(bed.Dir(), "pveemu")})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(emu)
	t.Cleanup(func() { ts.Close(); _ = emu.Close() })
	if err := emu.AddSandboxTemplate(ctx, 9000, filepath.Join(bed.Dir(), "template-disk"), ""); err != nil {
		t.Fatal(err)
	}
	id, secret, err := emu.ApplyAccessSetup(pveemu.AccessSetup{Templates: []int{9000}})
	if err != nil {
		t.Fatal(err)
	}
	px, err := pveapi.New(pveapi.Options{URL: ts.URL + "/api2/json", TokenID: id, Secret: secret, Node: "pve", HTTPClient: ts.Client(), TaskPoll: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	probePath, err := probebuild.Build(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}

	// The default configuration, with only what the check cannot guess:
	// the probe, the names, the public address; no [check] lan.
	cfg := config.Default()
	cfg.Guard.NodeRoot = bed.NodeRoot()
	cfg.API.QGADir = bed.QGADir()
	cfg.Check.ProbePath = probePath
	cfg.Check.ExternalName = "{random}." + testvm.InternetName
	cfg.Check.LocalName = testvm.LocalName("{zone}")
	cfg.Check.Public = []string{testvm.InternetAddr}
	cfg.Check.Timeout = 2 * time.Second
	if len(cfg.Check.LAN) != 0 {
		t.Fatalf("the default config has lan targets: %v", cfg.Check.LAN)
	}
	qc := qga.New(qga.Options{})
	cb := &checkBed{bed: bed, node: node}
	eng, err := sandbox.New(sandbox.Options{
		Node:         "pve",
		Proxmox:      px,
		Guests:       qc.SandboxGuests(),
		QGADir:       bed.QGADir(),
		StateDir:     filepath.Join(bed.Dir(), "api-state"),
		AgentTimeout: 2 * time.Minute,
		AutoCIDRPool: netip.MustParsePrefix(cfg.API.AutoCIDRPool),
		AutoCIDRBits: cfg.API.AutoCIDRBits,
		Checker:      newChecker(cfg, qc, nil, nil, node),
		ZonesChanged: func(ctx context.Context, z map[string][]string) error {
			cb.mu.Lock()
			defer cb.mu.Unlock()
			if cb.guard == nil {
				return nil
			}
			return cb.guard.SetZones(ctx, z)
		},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sandboxapi.New(eng, sandboxapi.Options{
		MaxFileBytes: 1 << 20,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.LocalHandler())
	t.Cleanup(hs.Close)
	cb.c = client.New(hs.URL)
	return cb
}

// startGuard installs the host guard in the node namespace with the zones
// the API already knows, and the layer-2 port map from the bed's files.
func (cb *checkBed) startGuard(t *testing.T, ctx context.Context, zones map[string][]string) {
	t.Helper()
	g, err := firewall.New(firewall.Config{DnsmasqUser: "dnsmasq", ProcRoot: t.TempDir(), StateDir: t.TempDir(), Zones: zones},
		firewall.WithNetNS(cb.node))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	m := &portmap.Mapper{Paths: portmap.Paths{Root: cb.bed.NodeRoot()}, Guard: g, Interval: 100 * time.Millisecond}
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(mctx) }()
	t.Cleanup(func() { stop(); <-done })
	cb.mu.Lock()
	cb.guard = g
	cb.mu.Unlock()
}

// rowsWith returns the rows whose check name contains every part.
func rowsWith(rep apitype.CheckReport, parts ...string) []apitype.CheckRow {
	var out []apitype.CheckRow
	for _, r := range rep.Rows {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(r.Target, p)
		}
		if ok {
			out = append(out, r)
		}
	}
	return out
}

// TestBedCheckDefaultConfig runs the full containment check through the
// sandbox API with the daemon's checker and the default configuration:
//
//   - without the guard (the honesty run) the check fails and the node's
//     UDP service rows are reachable: the UDP probe can see a leak;
//   - with the guard every row passes, and the rows discovery added
//     without configuration are there: the node's default gateway, a
//     neighbour on the management network, each private block, every node
//     address (TCP and UDP), the other sandbox's guest (TCP and UDP).
func TestBedCheckDefaultConfig(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cb := upCheckBed(t, ctx)
	a, err := cb.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := cb.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, id := range []string{a.ID, b.ID} {
			_ = cb.c.Delete(context.Background(), id)
		}
	})
	logRows := func(rep apitype.CheckReport) {
		for _, r := range rep.Rows {
			t.Logf("%-70s %-40s expect %-9s observed %-9s pass %-5v %s", r.Target, r.Probe, r.Expected, r.Observed, r.Pass, r.Detail)
		}
	}

	open, err := cb.c.Check(ctx, a.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Log("without the guard:")
	logRows(open)
	if open.Pass {
		t.Error("the check passed on a node without the guard")
	}
	udpServices := rowsWith(open, "(udp ", " via ")
	if len(udpServices) == 0 {
		t.Fatal("no UDP service rows")
	}
	for _, r := range udpServices {
		if r.Observed != "reachable" {
			t.Errorf("without the guard: %s observed %s (%s), want reachable", r.Target, r.Observed, r.Detail)
		}
	}

	zones := map[string][]string{}
	for _, sb := range []apitype.Sandbox{a, b} {
		for _, n := range sb.Networks {
			zones[sb.Zone] = append(zones[sb.Zone], n.VNet)
		}
	}
	cb.startGuard(t, ctx, zones)
	rep, err := cb.c.Check(ctx, a.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Log("with the guard:")
	logRows(rep)
	if !rep.Pass {
		for _, r := range rep.Rows {
			if !r.Pass {
				t.Errorf("with the guard: %s: %s observed %s: %s", r.Target, r.Probe, r.Observed, r.Detail)
			}
		}
	}
	gw := b.Networks[0].Gateway
	for _, want := range [][]string{
		{"LAN " + testvm.UplinkAddr + " "}, // the node's default gateway (TCP rows: "LAN <addr>" alone)
		{"LAN " + bedNeighbour},
		{"LAN 10.0.0.1"}, {"LAN 172.16.0.1"}, {"LAN 192.168.1.1"}, {"LAN 100.64.0.1"},
		{"LAN " + testvm.UplinkAddr, "(udp 53)"},
		{"via host " + testvm.NodeMgmtAddr}, {"(udp 123) via host " + testvm.NodeMgmtAddr}, {"(udp 53) via host " + testvm.NodeMgmtAddr},
		{"via host " + testvm.NodeMgmtAddr6},
		{"(udp 5405) via host " + gw}, // the other sandbox's gateway is a node address too
		{"(udp 123) via gateway"},
		{"other zone guest"}, {"other zone guest", "(udp 53)"},
		{"UDP canary on its own loopback"}, {"UDP canary"},
	} {
		rows := rowsWith(rep, want...)
		if len(rows) == 0 {
			t.Errorf("no row %q", want)
		}
		for _, r := range rows {
			if !r.Control && r.Observed != "blocked" {
				t.Errorf("%s: observed %s, want blocked", r.Target, r.Observed)
			}
		}
	}
	for _, r := range rowsWith(rep, "LAN 10.200.") {
		t.Errorf("a LAN row inside the sandboxes' pool: %s", r.Target)
	}
}
