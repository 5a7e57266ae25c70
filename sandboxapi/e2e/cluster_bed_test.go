package e2e_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

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

// clusterNode is one node of a cluster bed: its bed, its API (the
// emulator's NodeHandler) and the daemon running against it.
type clusterNode struct {
	name string
	bed  *testvm.Bed
	// px is the daemon's client (its node's token); dead wraps it as the
	// engine's Proxmox, so that the daemon can be killed mid-clone; root
	// is root's token on the node's API (the checks).
	px   *pveapi.Client
	dead *deadDaemon
	root *pveapi.Client
	opts options
	srv  *sandboxapi.Server
	c    *client.Client
	logs *syncBuffer
	// bridges are the node namespace's bridges before any sandbox.
	bridges map[string]bool
	// stopPool stops the daemon's RunPool and waits for it (no-op when
	// the daemon has no pool); set by start.
	stopPool func()
}

// syncBuffer is a log sink the daemon's goroutines share.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newClusterBed brings up a cluster of n nodes, pve1..pve<n>: one bed per
// node, one emulator serving them all (shared SDN, VMIDs, pools, users), a
// sandbox template on each node (9000 on pve1, 9001 on pve2, ...), and one
// daemon per node with its own state, checking its vnets' bridges in its
// node's namespace as the daemon does by default. mod, when set, changes
// every daemon's options (a warm pool, say).
func newClusterBed(t *testing.T, ctx context.Context, n int, mod func(*options)) (*pveemu.Server, []*clusterNode) {
	t.Helper()
	var names []string
	var beds []*testvm.Bed
	for i := range n {
		names = append(names, "pve"+strconv.Itoa(i+1))
		bed, err := testvm.Up(ctx, testvm.Options{Logger: testkit.FailureLog(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = bed.Close() })
		beds = append(beds, bed)
	}
	var others []pveemu.ClusterNode
	for i := 1; i < n; i++ {
		others = append(others, pveemu.ClusterNode{Name: names[i], Backend: pveemu.BedBackend{Bed: beds[i]}})
	}
	emu, err := pveemu.New(pveemu.Options{Node: names[0], Backend: pveemu.BedBackend{Bed: beds[0]}, DataDir: filepath.Join(beds[0].Dir(), "pveemu"), Cluster: others})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close() })
	if err := emu.AddSandboxTemplate(ctx, 9000, filepath.Join(beds[0].Dir(), "template-disk"), ""); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < n; i++ {
		disk := filepath.Join(beds[i].Dir(), "template-disk")
		if err := os.MkdirAll(filepath.Join(disk, "upper", "var", "tmp"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := emu.AddTemplate(ctx, 9000+i, pveemu.SandboxTemplate, disk, map[string]string{"net0": pveemu.SandboxNet0}); err != nil {
			t.Fatal(err)
		}
		if err := emu.MoveVM(9000+i, names[i]); err != nil {
			t.Fatal(err)
		}
	}
	var nodes []*clusterNode
	for i, name := range names {
		// pve-access-setup run on each node: the shipped role, its grants
		// for this node and template, a token per node
		id, secret, err := emu.ApplyAccessSetup(pveemu.AccessSetup{Node: name, Token: "daemon-" + name, Templates: []int{9000 + i}})
		if err != nil {
			t.Fatal(err)
		}
		h, err := emu.NodeHandler(name)
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewTLSServer(h)
		t.Cleanup(ts.Close)
		logs := &syncBuffer{}
		log := slog.New(slog.NewTextHandler(logs, nil))
		px, err := pveapi.New(pveapi.Options{URL: ts.URL + "/api2/json", TokenID: id, Secret: secret, Node: name, HTTPClient: ts.Client(),
			TaskPoll: 50 * time.Millisecond, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		netSys, err := beds[i].NodeNetSys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cn := &clusterNode{name: name, bed: beds[i], px: px, dead: aliveDaemon(px), root: rootClientOn(t, emu, ts.URL+"/api2/json", ts.Client(), "checks-"+name, name),
			logs: logs, bridges: nodeBridges(t, beds[i])}
		cn.opts = options{
			Options: sandbox.Options{Node: name, Proxmox: cn.dead, Guests: qga.New(qga.Options{}).SandboxGuests(), QGADir: beds[i].QGADir(),
				// The daemons take their automatic ranges from the same
				// (default) pool: they race for ranges.
				StateDir: filepath.Join(beds[i].Dir(), "api-state"), AgentTimeout: 3 * time.Minute, Logger: log,
				BridgeUp: sandbox.SysfsBridgeUp(filepath.Join(netSys, "class", "net"))},
			serverOptions: sandboxapi.Options{MaxFileBytes: 1 << 20, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		}
		if mod != nil {
			mod(&cn.opts)
		}
		cn.start(t, ctx)
		nodes = append(nodes, cn)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range nodes {
				n.logProblems(t)
			}
		}
	})
	return emu, nodes
}

// logProblems logs, for a failed test, the warnings and errors of the
// node's daemon (the last 60), what its dnsmasqs said beyond their start,
// and the node's bridges with their addresses and ports.
func (n *clusterNode) logProblems(t *testing.T) {
	var bad []string
	for _, l := range strings.Split(n.logs.String(), "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			bad = append(bad, l)
		}
	}
	t.Logf("%s: the daemon's last warnings and errors:\n%s", n.name, strings.Join(bad[max(0, len(bad)-60):], "\n"))
	logs, _ := filepath.Glob(filepath.Join(n.bed.Dir(), "dnsmasq", "*.log"))
	for _, f := range logs {
		b, _ := os.ReadFile(f)
		var odd []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "fail") || strings.Contains(l, "cannot") || strings.Contains(l, "error") || strings.Contains(l, "in use") {
				odd = append(odd, l)
			}
		}
		if len(odd) > 0 {
			t.Logf("%s: %s: %s", n.name, filepath.Base(f), strings.Join(odd, "\n"))
		}
	}
	for _, argv := range [][]string{{"ip", "-n", n.bed.NodeNS(), "-br", "addr", "show", "type", "bridge"}, {"bridge", "-n", n.bed.NodeNS(), "link"}} {
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		t.Logf("%s: %s: %v\n%s", n.name, strings.Join(argv, " "), err, out)
	}
}

// start starts the node's daemon on its state (reconciling first) and its
// warm pool's loop, as pve-inspectd run does; a daemon already running is
// left to the caller (stop its pool first).
func (n *clusterNode) start(t *testing.T, ctx context.Context) {
	t.Helper()
	srv, err := n.opts.start(ctx)
	if err != nil {
		t.Fatalf("%s: start the daemon: %v", n.name, err)
	}
	hs := httptest.NewServer(srv.LocalHandler())
	t.Cleanup(hs.Close)
	n.srv, n.c = srv, client.New(hs.URL)
	n.stopPool = func() {}
	if len(n.opts.WarmPool) == 0 {
		return
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); srv.Engine().RunPool(pctx) }()
	n.stopPool = func() { cancel(); <-done }
	t.Cleanup(n.stopPool)
}

// made is a sandbox one of the cluster's daemons made, and how long its
// create took (0: not measured).
type made struct {
	node int
	sb   apitype.Sandbox
	took time.Duration
}

// createWave sends per[i] creates of req to node i's daemon, all at once
// on every node, and returns what was made and the errors.
func createWave(ctx context.Context, nodes []*clusterNode, per []int, req apitype.CreateRequest) ([]made, []error) {
	var mu sync.Mutex
	var out []made
	errs := allAtOnce(per, func(ni, k int) error {
		t0 := time.Now()
		sb, err := nodes[ni].c.Create(ctx, req)
		if err != nil {
			return fmt.Errorf("%s create %d: %w", nodes[ni].name, k, err)
		}
		mu.Lock()
		out = append(out, made{ni, sb, time.Since(t0)})
		mu.Unlock()
		return nil
	})
	return out, errs
}

// deleteAll deletes every sandbox of ms through its own daemon, all at
// once, and returns the errors.
func deleteAll(ctx context.Context, nodes []*clusterNode, ms []made) []error {
	per := []int{len(ms)}
	return allAtOnce(per, func(_, k int) error {
		m := ms[k]
		if err := nodes[m.node].c.Delete(ctx, m.sb.ID); err != nil {
			return fmt.Errorf("%s delete %s: %w", nodes[m.node].name, m.sb.ID, err)
		}
		return nil
	})
}

// allAtOnce runs f(i, k) for every k < per[i] of every i at once and
// returns the errors.
func allAtOnce(per []int, f func(i, k int) error) []error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for i, n := range per {
		for k := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := f(i, k); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return errs
}

// sameForAll is per with v for each of n nodes.
func sameForAll(n, v int) []int {
	per := make([]int, n)
	for i := range per {
		per[i] = v
	}
	return per
}

// idsOf are the sandbox ids of ms.
func idsOf(ms []made) map[string]bool {
	ids := map[string]bool{}
	for _, m := range ms {
		ids[m.sb.ID] = true
	}
	return ids
}

// assertServing checks, for every sandbox of ms, that its VM answers an
// exec through its own daemon and is a guest of its node's bed with its
// disk on the node's storage, that each of its vnets' bridges is in its
// node's namespace and in no other node's (a zone runs on its daemon's
// node only), and that its zone's dnsmasq runs.
func assertServing(t *testing.T, ctx context.Context, nodes []*clusterNode, ms []made) {
	t.Helper()
	bridges := make([]map[string]bool, len(nodes))
	disks := make([]map[int]bool, len(nodes))
	for i, n := range nodes {
		bridges[i] = nodeBridges(t, n.bed)
		if !slices.ContainsFunc(ms, func(m made) bool { return m.node == i }) {
			continue // none of its sandboxes here (it may be down)
		}
		vols, err := n.root.ImageVolumes(ctx, "local-lvm")
		if err != nil {
			t.Errorf("%s: list local-lvm: %v", n.name, err)
		}
		disks[i] = map[int]bool{}
		for _, v := range vols {
			disks[i][v.VMID] = true
		}
	}
	for _, m := range ms {
		// its disk is on its node's storage (the leftover check's
		// listing sees what it should)
		if v := m.sb.VMs[0].VMID; !disks[m.node][v] {
			t.Errorf("%s: no volume of VM %d of %s on local-lvm", nodes[m.node].name, v, m.sb.ID)
		}
		for _, nw := range m.sb.Networks {
			for i, n := range nodes {
				if on := bridges[i][nw.VNet]; on != (i == m.node) {
					t.Errorf("%s: bridge %s of %s (made on %s) there: %v", n.name, nw.VNet, m.sb.ID, nodes[m.node].name, on)
				}
			}
		}
	}
	// a few execs at once per daemon: the owner's share of exec slots is 8
	slots := make([]chan struct{}, len(nodes))
	for i := range slots {
		slots[i] = make(chan struct{}, 4)
	}
	errs := allAtOnce([]int{len(ms)}, func(_, k int) error {
		m := ms[k]
		n := nodes[m.node]
		slots[m.node] <- struct{}{}
		defer func() { <-slots[m.node] }()
		res, err := n.c.Exec(ctx, m.sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"echo", m.sb.ID}, OutputLimit: 64})
		if err != nil || string(res.Stdout) != m.sb.ID+"\n" {
			return fmt.Errorf("%s exec in %s: %+v %v", n.name, m.sb.ID, res, err)
		}
		if _, ok := n.bed.Guest(m.sb.VMs[0].VMID); !ok {
			return fmt.Errorf("%s: VM %d of %s is not its guest", n.name, m.sb.VMs[0].VMID, m.sb.ID)
		}
		return nil
	})
	for _, err := range errs {
		t.Error(err)
	}
	// and its zone's dnsmasq runs on its node (the leftover check's scan
	// sees what it should). Every apply, a pool's refill or another
	// daemon's, restarts every dnsmasq of every node: one may be between
	// its stop and its start for a moment.
	missing := ms
	for deadline := time.Now().Add(30 * time.Second); ; {
		running := make([]string, len(nodes))
		for i, n := range nodes {
			running[i] = strings.Join(dnsmasqsOf(t, n.bed), "\n")
		}
		var still []made
		for _, m := range missing {
			if !strings.Contains(running[m.node], "--domain="+m.sb.Zone+".test ") {
				still = append(still, m)
			}
		}
		if missing = still; len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, m := range missing {
		t.Errorf("%s: no dnsmasq of %s", nodes[m.node].name, m.sb.Zone)
	}
}

// assertDistinct checks that no two of the sandboxes of ms and the ready
// pool members of the nodes (all alive at once) share an id, a VMID or an
// overlapping CIDR.
func assertDistinct(t *testing.T, nodes []*clusterNode, ms []made) {
	t.Helper()
	type owner struct {
		id    string
		vmids []int
		cidrs []string
	}
	var all []owner
	for _, m := range ms {
		o := owner{id: m.sb.ID}
		for _, v := range m.sb.VMs {
			o.vmids = append(o.vmids, v.VMID)
		}
		for _, nw := range m.sb.Networks {
			o.cidrs = append(o.cidrs, nw.CIDR)
		}
		all = append(all, o)
	}
	for _, n := range nodes {
		for _, pm := range n.srv.Engine().Pool().Members {
			if pm.State != apitype.StateReady {
				// one building may hold an id its clone is yet to win
				// (two nodes' creates picked it: one retries), one
				// going or failed (its node down, its teardown too) an
				// id and range it may never have made or has given
				// back, another's by now
				continue
			}
			all = append(all, owner{id: pm.ID + " (" + n.name + "'s pool member, " + pm.State + ")", vmids: pm.VMIDs, cidrs: pm.CIDRs})
		}
	}
	ids, vmids := map[string]bool{}, map[int]string{}
	cidrs := map[netip.Prefix]string{}
	for _, o := range all {
		if ids[o.id] {
			t.Errorf("sandbox id %s twice", o.id)
		}
		ids[o.id] = true
		for _, v := range o.vmids {
			if other, dup := vmids[v]; dup {
				t.Errorf("VMID %d of %s and of %s", v, o.id, other)
			}
			vmids[v] = o.id
		}
		for _, c := range o.cidrs {
			p := netip.MustParsePrefix(c)
			for q, other := range cidrs {
				if p.Overlaps(q) {
					t.Errorf("CIDR %s of %s overlaps %s of %s", p, o.id, q, other)
				}
			}
			cidrs[p] = o.id
		}
	}
}

// TestBedCluster: two daemons on two nodes of one cluster create 10
// sandboxes each at the same time, then delete them at the same time; all
// succeed, ids and CIDRs of the 20 never collide, every one answers while
// the others' applies restart every dnsmasq, and nothing is left on either
// node. Then one node goes down:
// its daemon's creates fail, the other node's still succeed.
func TestBedCluster(t *testing.T) {
	testkit.RequireRoot(t, "dnsmasq", "qemu-ga")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	emu, nodes := newClusterBed(t, ctx, 2, nil)
	const perNode = 10
	plain := apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}}
	all, errs := createWave(ctx, nodes, sameForAll(len(nodes), perNode), plain)
	// Every sandbox answers, on its own node, once all exist.
	assertServing(t, ctx, nodes, all)
	assertDistinct(t, nodes, all)
	errs = append(errs, deleteAll(ctx, nodes, all)...)
	for _, err := range errs {
		t.Error(err)
	}
	if len(all) != 2*perNode {
		t.Errorf("%d sandboxes made, want %d", len(all), 2*perNode)
	}
	assertSandboxesGone(t, ctx, emu, nodes, idsOf(all))
	assertClusterEmpty(t, ctx, emu, nodes)
	for _, n := range nodes {
		t.Logf("%s: %d creates backed off a range another node's sandbox took", n.name, strings.Count(n.logs.String(), "took the range too"))
	}

	// pve2 goes down: its daemon cannot reach its node and says so; pve1's
	// apply only warns about pve2 and its create succeeds.
	if err := emu.SetNodeOnline("pve2", false); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes[1].c.Create(ctx, plain); err == nil || !strings.Contains(err.Error(), "does not answer (is the node down?)") {
		t.Errorf("create on pve2 while it is down: %v", err)
	}
	sb, err := nodes[0].c.Create(ctx, plain)
	if err != nil {
		t.Fatalf("create on pve1 while pve2 is down: %v", err)
	}
	if res, err := nodes[0].c.Exec(ctx, sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec on pve1 while pve2 is down: %+v %v", res, err)
	}
	if err := nodes[0].c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(nodes[0].logs.String(), "another cluster node failed its network reload") {
		t.Error("pve1's daemon did not log pve2's reload warning")
	}
	if err := emu.SetNodeOnline("pve2", true); err != nil {
		t.Fatal(err)
	}
	assertSandboxesGone(t, ctx, emu, nodes, map[string]bool{sb.ID: true})
}

// assertSandboxesGone checks that nothing of the given sandboxes is left on
// any node: no VM tagged with one, no zone or vnet of one (running or
// pending), no IPAM entry, dnsmasq or bridge of one.
func assertSandboxesGone(t *testing.T, ctx context.Context, emu *pveemu.Server, nodes []*clusterNode, ids map[string]bool) {
	t.Helper()
	for _, n := range nodes {
		vms, err := n.root.ListVMs(ctx)
		if err != nil {
			t.Errorf("%s: list VMs: %v", n.name, err)
		}
		for _, v := range vms {
			for id := range ids {
				if slices.Contains(v.Tags, "pvei-s-"+id) {
					t.Errorf("%s: VM of %s left: %+v", n.name, id, v)
				}
			}
		}
		br := nodeBridges(t, n.bed)
		for id := range ids {
			if pid := n.bed.DnsmasqPID(id); pid != 0 {
				t.Errorf("%s: dnsmasq of %s left: %d", n.name, id, pid)
			}
			for b := range br {
				if strings.HasPrefix(b, "v"+id[2:]) {
					t.Errorf("%s: bridge %s of %s left", n.name, b, id)
				}
			}
		}
	}
	zones, vnets := sdnLeft(t, ctx, nodes[0].root)
	for id := range ids {
		if slices.Contains(zones, id) {
			t.Errorf("zone %s left", id)
		}
		for zone, vs := range vnets {
			if zone == id {
				t.Errorf("vnets %v of %s left", vs, id)
			}
		}
		if got := emu.IPAMEntries(id); len(got) != 0 {
			t.Errorf("IPAM entries of %s left: %v", id, got)
		}
	}
	if v := emu.Violations(); len(v) != 0 {
		t.Errorf("schema violations: %+v", v)
	}
}

// assertClusterEmpty checks, as root, that the cluster holds nothing of
// any sandbox or pool member: no VM but the templates on any node, no
// image volume on any node's storages but the templates', no SDN zone,
// vnet or subnet (running or pending), no IPAM entry, and on every node no
// dnsmasq, guest namespace or bridge the bed did not start with.
func assertClusterEmpty(t *testing.T, ctx context.Context, emu *pveemu.Server, nodes []*clusterNode) {
	t.Helper()
	for _, n := range nodes {
		vms, err := n.root.ListVMs(ctx)
		if err != nil {
			t.Errorf("%s: list VMs: %v", n.name, err)
		}
		templates := map[int]bool{}
		for _, v := range vms {
			if !v.Template {
				t.Errorf("%s: VM left: %+v", n.name, v)
			}
			templates[v.VMID] = v.Template
		}
		for _, st := range []string{"local", "local-lvm"} {
			vols, err := n.root.ImageVolumes(ctx, st)
			if err != nil {
				t.Errorf("%s: list %s: %v", n.name, st, err)
			}
			for _, v := range vols {
				if !templates[v.VMID] {
					t.Errorf("%s: volume left: %s", n.name, v.VolID)
				}
			}
		}
		if left := dnsmasqsOf(t, n.bed); len(left) != 0 {
			t.Errorf("%s: dnsmasqs left: %v", n.name, left)
		}
		out, _ := exec.Command("ip", "netns", "list").Output()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, n.bed.Name()+"-g") {
				t.Errorf("%s: guest namespace left: %s", n.name, l)
			}
		}
		for b := range nodeBridges(t, n.bed) {
			if !n.bridges[b] {
				t.Errorf("%s: bridge left: %s", n.name, b)
			}
		}
	}
	zones, vnets := sdnLeft(t, ctx, nodes[0].root)
	if len(zones) != 0 || len(vnets) != 0 {
		t.Errorf("SDN left: zones %v, vnets %v", zones, vnets)
	}
	if cidrs, err := nodes[0].root.ListSubnetCIDRs(ctx); err != nil || len(cidrs) != 0 {
		t.Errorf("subnets left: %v %v", cidrs, err)
	}
	if z := emu.IPAMZones(); len(z) != 0 {
		t.Errorf("IPAM entries left in zones %v", z)
	}
	if v := emu.Violations(); len(v) != 0 {
		t.Errorf("schema violations: %+v", v)
	}
}

// sdnLeft lists, as root sees them with pending changes, the SDN zones and
// the vnets by zone.
func sdnLeft(t *testing.T, ctx context.Context, root *pveapi.Client) (zones []string, vnets map[string][]string) {
	t.Helper()
	var zs []struct {
		Zone string `json:"zone"`
	}
	var vs []struct {
		VNet string `json:"vnet"`
		Zone string `json:"zone"`
	}
	if err := root.Get(ctx, "/cluster/sdn/zones?pending=1", &zs); err != nil {
		t.Errorf("list zones: %v", err)
	}
	if err := root.Get(ctx, "/cluster/sdn/vnets?pending=1", &vs); err != nil {
		t.Errorf("list vnets: %v", err)
	}
	for _, z := range zs {
		zones = append(zones, z.Zone)
	}
	vnets = map[string][]string{}
	for _, v := range vs {
		vnets[v.Zone] = append(vnets[v.Zone], v.VNet)
	}
	return zones, vnets
}

// nodeBridges are the bridges in the bed's node namespace.
func nodeBridges(t *testing.T, bed *testvm.Bed) map[string]bool {
	t.Helper()
	out, err := exec.Command("ip", "-n", bed.NodeNS(), "-o", "link", "show", "type", "bridge").Output()
	if err != nil {
		t.Fatalf("list bridges of %s: %v", bed.NodeNS(), err)
	}
	br := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		br[name] = true
	}
	return br
}

// dnsmasqsOf lists the dnsmasq processes the bed started (their pid file
// is in its directory) that still run, as "pid cmdline".
func dnsmasqsOf(t *testing.T, bed *testvm.Bed) []string {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	mark := "--pid-file=" + filepath.Join(bed.Dir(), "dnsmasq") + "/"
	var out []string
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != "dnsmasq" || !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, mark) }) {
			continue
		}
		out = append(out, filepath.Base(filepath.Dir(p))+" "+strings.Join(args, " "))
	}
	return out
}
