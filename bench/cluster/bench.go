// Package cluster measures sandbox creates on a cluster whose SDN applies
// cost what Proxmox's own code spends on them (testvm/pveemu ReloadCost:
// each node's reload restarts every DHCP zone's dnsmasq, and the nodes
// are reloaded one after another; FIDELITY.md, issue 36 item 10). The
// nodes are the emulator's, with fake backends (no root): what is
// measured is the daemon's engine and the apply's modelled cost, not
// guests.
//
//   - creates per minute on one node and on three (one daemon per node,
//     all creating at once), with the engine's shared applies against one
//     apply per create (sandbox.Options.UnbatchedApplies, the behaviour
//     before applies were shared);
//   - an apply's time at 10, 100 and 300 DHCP zones in the cluster (three
//     nodes), and the time of a burst of creates at that size, shared
//     against one apply per create.
//
// cmd/pve-inspect-bench runs it as section "cluster".
package cluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu/emuguest"
)

// Options size the section.
type Options struct {
	// Nodes are the cluster sizes of the creates-per-minute figure (1, 3).
	Nodes []int
	// Creates is how many sandboxes each node's daemon creates at once
	// (10).
	Creates int
	// Zones are the cluster's DHCP zone counts of the apply figure (10,
	// 100, 300).
	Zones []int
	// ZoneNodes is the cluster size of the apply figure (3).
	ZoneNodes int
	// Burst is how many creates one daemon makes at once at each zone
	// count (10).
	Burst int
	// Cost is the modelled reload: 50 ms a node and 3 ms a DHCP zone
	// (three systemctl calls of 1 ms) when zero, a hundredth of a real
	// node's so the section runs in minutes; the ratios are what count.
	Cost pveemu.ReloadCost
}

func (o *Options) defaults() {
	if len(o.Nodes) == 0 {
		o.Nodes = []int{1, 3}
	}
	if o.Creates <= 0 {
		o.Creates = 10
	}
	if len(o.Zones) == 0 {
		o.Zones = []int{10, 100, 300}
	}
	if o.ZoneNodes <= 0 {
		o.ZoneNodes = 3
	}
	if o.Burst <= 0 {
		o.Burst = 10
	}
	if o.Cost == (pveemu.ReloadCost{}) {
		o.Cost = pveemu.ReloadCost{PerNode: 50 * time.Millisecond, PerDHCPZone: 3 * time.Millisecond}
	}
}

// Burst is one run of creates: how long they took, how many succeeded
// and how many SDN applies (PUT /cluster/sdn) the daemons made.
type Burst struct {
	Took    time.Duration
	OK      int
	Failed  int
	Applies int
	// FirstErr is the first failure, if any.
	FirstErr string
}

// PerMinute is the burst's successful creates per minute.
func (b Burst) PerMinute() float64 {
	if b.Took <= 0 {
		return 0
	}
	return float64(b.OK) / b.Took.Minutes()
}

// Throughput is the creates-per-minute figure of one cluster size.
type Throughput struct {
	Nodes          int
	Shared, OnEach Burst
}

// ZoneRow is the apply figure at one zone count.
type ZoneRow struct {
	Zones int
	// Apply is the time of one apply with nothing pending.
	Apply          time.Duration
	Shared, OnEach Burst
}

// Result is the whole section.
type Result struct {
	Cost       pveemu.ReloadCost
	Throughput []Throughput
	ZoneRows   []ZoneRow
}

// Run measures and prints the section's tables to out.
func Run(ctx context.Context, o Options, out io.Writer) (Result, error) {
	o.defaults()
	res := Result{Cost: o.Cost}
	fmt.Fprintf(out, "cluster: SDN apply cost model: %v a node + %v per DHCP zone of the cluster, per node, nodes one after another (testvm/pveemu ReloadCost)\n",
		o.Cost.PerNode, o.Cost.PerDHCPZone)
	for _, n := range o.Nodes {
		tp := Throughput{Nodes: n}
		var err error
		tp.Shared, tp.OnEach, _, err = both(ctx, o, n, 0, slices.Repeat([]int{o.Creates}, n))
		if err != nil {
			return res, err
		}
		res.Throughput = append(res.Throughput, tp)
	}
	fmt.Fprintf(out, "\n%-7s %-8s %-26s %-26s %s\n", "nodes", "creates", "shared applies", "one apply per create", "ratio")
	for _, tp := range res.Throughput {
		fmt.Fprintf(out, "%-7d %-8d %-26s %-26s %s\n", tp.Nodes, tp.Nodes*o.Creates, perMinute(tp.Shared), perMinute(tp.OnEach), ratio(tp.Shared.PerMinute(), tp.OnEach.PerMinute()))
	}
	for _, z := range o.Zones {
		row := ZoneRow{Zones: z}
		var err error
		row.Shared, row.OnEach, row.Apply, err = both(ctx, o, o.ZoneNodes, z, []int{o.Burst})
		if err != nil {
			return res, err
		}
		res.ZoneRows = append(res.ZoneRows, row)
	}
	fmt.Fprintf(out, "\n%d nodes, %d creates on one node at once:\n%-7s %-10s %-30s %-30s %s\n", o.ZoneNodes, o.Burst, "zones", "one apply", "shared applies", "one apply per create", "ratio")
	for _, r := range res.ZoneRows {
		fmt.Fprintf(out, "%-7d %-10s %-30s %-30s %s\n", r.Zones, r.Apply.Round(time.Millisecond), took(r.Shared), took(r.OnEach),
			ratio(r.OnEach.Took.Seconds(), r.Shared.Took.Seconds()))
	}
	failed := func(what string, bs ...Burst) {
		for _, b := range bs {
			if b.Failed > 0 {
				fmt.Fprintf(out, "%s: %d creates failed, first: %s\n", what, b.Failed, b.FirstErr)
			}
		}
	}
	for _, tp := range res.Throughput {
		failed(fmt.Sprintf("%d nodes", tp.Nodes), tp.Shared, tp.OnEach)
	}
	for _, r := range res.ZoneRows {
		failed(fmt.Sprintf("%d zones", r.Zones), r.Shared, r.OnEach)
	}
	return res, nil
}

func perMinute(b Burst) string {
	return fmt.Sprintf("%.0f/min (%d applies)", b.PerMinute(), b.Applies)
}

func took(b Burst) string {
	return fmt.Sprintf("%s (%d applies)", b.Took.Round(time.Millisecond), b.Applies)
}

func ratio(a, b float64) string {
	if b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fx", a/b)
}

// both runs one burst with the engine's shared applies and one with one
// apply per create, each on a fresh cluster of n nodes and zones DHCP
// zones, where node i's daemon creates counts[i] sandboxes at once; apply
// is the time of one apply with nothing pending, on the first cluster.
func both(ctx context.Context, o Options, n, zones int, counts []int) (shared, onEach Burst, apply time.Duration, err error) {
	if shared, apply, err = burstOn(ctx, o, n, zones, counts, false); err != nil {
		return
	}
	onEach, _, err = burstOn(ctx, o, n, zones, counts, true)
	return
}

// burstOn is one burst of both.
func burstOn(ctx context.Context, o Options, n, zones int, counts []int, unbatched bool) (Burst, time.Duration, error) {
	c, err := newCluster(ctx, n, o.Cost, unbatched)
	if err != nil {
		return Burst{}, 0, err
	}
	defer c.close()
	if err := c.addZones(ctx, zones); err != nil {
		return Burst{}, 0, err
	}
	start := time.Now()
	if err := c.root.ApplySDN(ctx); err != nil {
		return Burst{}, 0, fmt.Errorf("cluster bench: apply with nothing pending: %w", err)
	}
	apply := time.Since(start)
	c.applies.Store(0)
	return c.burst(ctx, counts), apply, nil
}

// cluster is an emulated cluster with one daemon engine per node.
type cluster struct {
	dir     string
	emu     *pveemu.Server
	fbs     []*pveemu.FakeBackend
	servers []*httptest.Server
	nodes   []*node
	root    *pveapi.Client
	// applies counts PUT /cluster/sdn on every node's API.
	applies atomic.Int64
}

// node is one node's daemon: its Proxmox client and its sandbox API,
// served as the daemon serves it and called through the API's client.
type node struct {
	name string
	px   *pveapi.Client
	c    *client.Client
}

func newCluster(ctx context.Context, n int, cost pveemu.ReloadCost, unbatched bool) (c *cluster, err error) {
	dir, err := os.MkdirTemp("", "pvei-bench-cluster-")
	if err != nil {
		return nil, err
	}
	c = &cluster{dir: dir}
	defer func() {
		if err != nil {
			c.close()
			c = nil
		}
	}()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("pve%d", i+1)
		run := filepath.Join(dir, names[i])
		if err := os.MkdirAll(run, 0o755); err != nil {
			return nil, err
		}
		c.fbs = append(c.fbs, pveemu.NewFakeBackend(run))
	}
	var others []pveemu.ClusterNode
	for i := 1; i < n; i++ {
		others = append(others, pveemu.ClusterNode{Name: names[i], Backend: c.fbs[i]})
	}
	c.emu, err = pveemu.New(pveemu.Options{Node: names[0], Backend: c.fbs[0], DataDir: filepath.Join(dir, "data"),
		StatsInterval: -1, Cluster: others, ReloadCost: cost})
	if err != nil {
		return nil, err
	}
	if err := c.emu.AddPool("pve-inspect", ""); err != nil {
		return nil, err
	}
	disk := filepath.Join(dir, "tdisk")
	for _, d := range []string{"etc", "tmp"} {
		if err := os.MkdirAll(filepath.Join(disk, d), 0o1777); err != nil {
			return nil, err
		}
	}
	id, secret, err := c.emu.RootToken("bench")
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.DiscardHandler)
	for i, name := range names {
		if err := c.emu.AddTemplate(ctx, 9000+i, "debian", disk, map[string]string{"net0": "virtio,bridge=vmbr0"}); err != nil {
			return nil, err
		}
		if i > 0 {
			if err := c.emu.MoveVM(9000+i, name); err != nil {
				return nil, err
			}
		}
		h, err := c.emu.NodeHandler(name)
		if err != nil {
			return nil, err
		}
		ts := httptest.NewTLSServer(c.countApplies(h))
		c.servers = append(c.servers, ts)
		px, err := pveapi.New(pveapi.Options{URL: ts.URL + "/api2/json", TokenID: id, Secret: secret, Node: name, HTTPClient: ts.Client(),
			TaskPoll: 20 * time.Millisecond, Logger: log})
		if err != nil {
			return nil, fmt.Errorf("cluster bench: proxmox client: %w", err)
		}
		if i == 0 {
			c.root = px
		}
		fb := c.fbs[i]
		eng, err := sandbox.New(sandbox.Options{Node: name, Proxmox: px, Guests: emuguest.Dial, QGADir: filepath.Join(dir, name),
			StateDir: filepath.Join(dir, "state-"+name), AgentTimeout: 30 * time.Second, UnbatchedApplies: unbatched, Logger: log,
			BridgeUp: func(_ context.Context, bridge string) (bool, error) {
				_, ok := fb.VNet(bridge)
				return ok, nil
			},
			GatewayUp: func(_ context.Context, bridge string, gw netip.Addr) (bool, error) {
				v, ok := fb.VNet(bridge)
				return ok && v.Gateway == gw, nil
			}})
		if err != nil {
			return nil, err
		}
		srv, err := sandboxapi.New(eng, sandboxapi.Options{Logger: log})
		if err != nil {
			return nil, err
		}
		if _, err := eng.Reconcile(ctx); err != nil {
			return nil, err
		}
		hs := httptest.NewServer(srv.LocalHandler())
		c.servers = append(c.servers, hs)
		c.nodes = append(c.nodes, &node{name: name, px: px, c: client.New(hs.URL)})
	}
	return c, nil
}

// countApplies counts the SDN applies h receives.
func (c *cluster) countApplies(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/cluster/sdn") {
			c.applies.Add(1)
		}
		h.ServeHTTP(w, r)
	})
}

// addZones adds n DHCP zones of nobody's sandbox, spread over the nodes,
// and applies them (untimed): the cluster's size the next applies pay
// for.
func (c *cluster) addZones(ctx context.Context, n int) error {
	if n == 0 {
		return nil
	}
	for i := range n {
		if err := c.nodes[i%len(c.nodes)].px.CreateZone(ctx, sandbox.ZoneSpec{ID: fmt.Sprintf("bz%d", i)}); err != nil {
			return fmt.Errorf("cluster bench: zone %d: %w", i, err)
		}
	}
	return c.root.ApplySDN(ctx)
}

// burst has node i's daemon create counts[i] sandboxes, all at once on
// every node, and deletes them afterwards (untimed).
func (c *cluster) burst(ctx context.Context, counts []int) Burst {
	var (
		mu  sync.Mutex
		b   Burst
		ids = map[int][]string{}
		wg  sync.WaitGroup
	)
	start := time.Now()
	for i, k := range counts {
		for range k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb, err := c.nodes[i].c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					b.Failed++
					if b.FirstErr == "" {
						b.FirstErr = err.Error()
					}
					return
				}
				b.OK++
				ids[i] = append(ids[i], sb.ID)
			}()
		}
	}
	wg.Wait()
	b.Took = time.Since(start)
	b.Applies = int(c.applies.Load())
	for i, list := range ids {
		for _, id := range list {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = c.nodes[i].c.Delete(ctx, id)
			}()
		}
	}
	wg.Wait()
	return b
}

func (c *cluster) close() {
	for _, ts := range c.servers {
		ts.Close()
	}
	if c.emu != nil {
		_ = c.emu.Close()
	}
	for _, fb := range c.fbs {
		_ = fb.Close()
	}
	_ = os.RemoveAll(c.dir)
}
