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
	px   *pveapi.Client
	c    *client.Client
	logs *syncBuffer
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

// newClusterBed brings up a two-node cluster: one bed per node (pve1,
// pve2), one emulator serving both (shared SDN, VMIDs, pools, users), a
// sandbox template on each node, and one daemon per node with its own
// state.
func newClusterBed(t *testing.T, ctx context.Context) (*pveemu.Server, []*clusterNode) {
	t.Helper()
	names := []string{"pve1", "pve2"}
	var beds []*testvm.Bed
	for range names {
		bed, err := testvm.Up(ctx, testvm.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = bed.Close() })
		beds = append(beds, bed)
	}
	emu, err := pveemu.New(pveemu.Options{Node: names[0], Backend: pveemu.BedBackend{Bed: beds[0]}, DataDir: filepath.Join(beds[0].Dir(), "pveemu"),
		Cluster: []pveemu.ClusterNode{{Name: names[1], Backend: pveemu.BedBackend{Bed: beds[1]}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close() })
	if err := emu.AddSandboxTemplate(ctx, 9000, filepath.Join(beds[0].Dir(), "template-disk"), ""); err != nil {
		t.Fatal(err)
	}
	disk2 := filepath.Join(beds[1].Dir(), "template-disk")
	if err := os.MkdirAll(filepath.Join(disk2, "upper", "var", "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := emu.AddTemplate(ctx, 9001, pveemu.SandboxTemplate, disk2, map[string]string{"net0": pveemu.SandboxNet0}); err != nil {
		t.Fatal(err)
	}
	if err := emu.MoveVM(9001, names[1]); err != nil {
		t.Fatal(err)
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
		o := options{
			Options: sandbox.Options{Node: name, Proxmox: px, Guests: qga.New(qga.Options{}).SandboxGuests(), QGADir: beds[i].QGADir(),
				// Both daemons take their automatic ranges from the same
				// (default) pool: they race for ranges.
				StateDir: filepath.Join(beds[i].Dir(), "api-state"), AgentTimeout: 3 * time.Minute, Logger: log},
			serverOptions: sandboxapi.Options{MaxFileBytes: 1 << 20, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		}
		srv, err := o.start(ctx)
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(srv.LocalHandler())
		t.Cleanup(hs.Close)
		nodes = append(nodes, &clusterNode{name: name, bed: beds[i], px: px, c: client.New(hs.URL), logs: logs})
	}
	return emu, nodes
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
	emu, nodes := newClusterBed(t, ctx)
	const perNode = 10
	type made struct {
		node int
		sb   apitype.Sandbox
	}
	var (
		mu   sync.Mutex
		all  []made
		errs []error
	)
	// each runs f for every node, perNode times, all at once.
	each := func(f func(ni, k int) error) {
		var wg sync.WaitGroup
		for ni := range nodes {
			for k := range perNode {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := f(ni, k); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
	}
	each(func(ni, k int) error {
		n := nodes[ni]
		sb, err := n.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
		if err != nil {
			return fmt.Errorf("%s create %d: %w", n.name, k, err)
		}
		mu.Lock()
		all = append(all, made{ni, sb})
		mu.Unlock()
		return nil
	})
	// Every sandbox answers, on its own node, once all exist.
	mu.Lock()
	created := append([]made(nil), all...)
	mu.Unlock()
	for _, m := range created {
		n := nodes[m.node]
		res, err := n.c.Exec(ctx, m.sb.ID, "vm0", apitype.ExecRequest{Argv: []string{"echo", m.sb.ID}})
		if err != nil || string(res.Stdout) != m.sb.ID+"\n" {
			t.Errorf("%s exec in %s: %+v %v", n.name, m.sb.ID, res, err)
		}
		if _, ok := n.bed.Guest(m.sb.VMs[0].VMID); !ok {
			t.Errorf("%s: VM %d of %s is not its guest", n.name, m.sb.VMs[0].VMID, m.sb.ID)
		}
	}
	each(func(ni, k int) error {
		var mine []string
		for _, m := range created {
			if m.node == ni {
				mine = append(mine, m.sb.ID)
			}
		}
		if k >= len(mine) {
			return nil
		}
		if err := nodes[ni].c.Delete(ctx, mine[k]); err != nil {
			return fmt.Errorf("%s delete %s: %w", nodes[ni].name, mine[k], err)
		}
		return nil
	})
	for _, err := range errs {
		t.Error(err)
	}
	if len(all) != 2*perNode {
		t.Errorf("%d sandboxes made, want %d", len(all), 2*perNode)
	}
	ids, vmids := map[string]bool{}, map[int]bool{}
	var cidrs []netip.Prefix
	for _, m := range all {
		if ids[m.sb.ID] {
			t.Errorf("sandbox id %s twice", m.sb.ID)
		}
		ids[m.sb.ID] = true
		for _, v := range m.sb.VMs {
			if vmids[v.VMID] {
				t.Errorf("VMID %d twice", v.VMID)
			}
			vmids[v.VMID] = true
		}
		for _, n := range m.sb.Networks {
			p := netip.MustParsePrefix(n.CIDR)
			for _, q := range cidrs {
				if p.Overlaps(q) {
					t.Errorf("CIDR %s of %s overlaps %s", p, m.sb.ID, q)
				}
			}
			cidrs = append(cidrs, p)
		}
	}
	assertClusterClean(t, ctx, emu, nodes, ids)
	for _, n := range nodes {
		t.Logf("%s: %d creates backed off a range another node's sandbox took", n.name, strings.Count(n.logs.String(), "took the range too"))
	}

	// pve2 goes down: its daemon cannot reach its node and says so; pve1's
	// apply only warns about pve2 and its create succeeds.
	if err := emu.SetNodeOnline("pve2", false); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes[1].c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}}); err == nil || !strings.Contains(err.Error(), "does not answer (is the node down?)") {
		t.Errorf("create on pve2 while it is down: %v", err)
	}
	sb, err := nodes[0].c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
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
	assertClusterClean(t, ctx, emu, nodes, map[string]bool{sb.ID: true})
}

// assertClusterClean checks that neither node has VMs but templates,
// vnets, guests, bridges or dnsmasqs of the given sandboxes left.
func assertClusterClean(t *testing.T, ctx context.Context, emu *pveemu.Server, nodes []*clusterNode, ids map[string]bool) {
	t.Helper()
	for _, n := range nodes {
		vms, err := n.px.ListVMs(ctx)
		if err != nil {
			t.Errorf("%s: list VMs: %v", n.name, err)
		}
		for _, v := range vms {
			if !v.Template {
				t.Errorf("%s: VM left: %+v", n.name, v)
			}
		}
		for id := range ids {
			if pid := n.bed.DnsmasqPID(id); pid != 0 {
				t.Errorf("%s: dnsmasq of %s left: %d", n.name, id, pid)
			}
		}
		out, _ := exec.Command("ip", "netns", "list").Output()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, n.bed.Name()+"-g") {
				t.Errorf("%s: guest namespace left: %s", n.name, l)
			}
		}
		links, _ := exec.Command("ip", "-n", n.bed.NodeNS(), "-o", "link", "show", "type", "bridge").Output()
		for id := range ids {
			if strings.Contains(string(links), "v"+id[2:]) {
				t.Errorf("%s: a bridge of %s left: %s", n.name, id, links)
			}
		}
	}
	vnets, err := nodes[0].px.ListVNets(ctx)
	if err != nil || len(vnets) != 0 {
		t.Errorf("vnets left: %+v %v", vnets, err)
	}
	for id := range ids {
		if got := emu.IPAMEntries(id); len(got) != 0 {
			t.Errorf("IPAM entries of %s left: %v", id, got)
		}
	}
	if v := emu.Violations(); len(v) != 0 {
		t.Errorf("schema violations: %+v", v)
	}
}
