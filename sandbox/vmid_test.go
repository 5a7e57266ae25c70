package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
)

// clusterCloner is this node's Proxmox in a cluster where another node
// has VM 101: clone_vm checks only the local node's config file, so a
// clone to 101 fails late, in pmxcfs, which the client classifies as
// ErrExists; GET /cluster/nextid?vmid=N (VMIDFree) knows the whole
// cluster. The clone to 100 parks until released, holding its id.
type clusterCloner struct {
	*apitest.Proxmox
	foreign map[int]bool
	// tempConfig makes the parked clone show its temporary config
	// ("lock: clone") first, as qemu-server's worker writes it, so that
	// the cluster counts its id as taken.
	tempConfig bool
	parked     chan struct{}
	release    chan struct{}
	mu         sync.Mutex
	attempts   map[int]int
	checks     int
}

// NextID is the cluster's: the lowest id no node has.
func (c *clusterCloner) NextID(ctx context.Context) (int, error) {
	return clusterNextID(ctx, c.Proxmox, c.foreign)
}

// clusterNextID is the lowest id neither px nor another node (foreign)
// has.
func clusterNextID(ctx context.Context, px *apitest.Proxmox, foreign map[int]bool) (int, error) {
	id, err := px.NextID(ctx)
	for err == nil && foreign[id] {
		id++
		for _, local := px.VMByID(id); local; _, local = px.VMByID(id) {
			id++
		}
	}
	return id, err
}

func (c *clusterCloner) CloneVM(ctx context.Context, s sandbox.CloneSpec) error {
	c.mu.Lock()
	c.attempts[s.NewID]++
	c.mu.Unlock()
	if c.foreign[s.NewID] {
		return fmt.Errorf("clone: %w: close (rename) atomic file '/etc/pve/nodes/node1/qemu-server/%d.conf' failed: File exists", sandbox.ErrExists, s.NewID)
	}
	if s.NewID == 100 {
		if c.tempConfig {
			c.AddVM(sandbox.VMInfo{VMID: 100, Status: "stopped", Lock: "clone"})
		}
		c.parked <- struct{}{}
		<-c.release
		if c.tempConfig {
			// the worker's temporary config becomes the clone's own
			_ = c.Proxmox.DeleteVM(ctx, 100)
		}
	}
	return c.Proxmox.CloneVM(ctx, s)
}

func (c *clusterCloner) VMIDFree(ctx context.Context, id int) (bool, error) {
	c.mu.Lock()
	c.checks++
	c.mu.Unlock()
	_, local := c.VMByID(id)
	return !local && !c.foreign[id], nil
}

// TestVMIDPastAReservedOneAsksTheCluster: while one create's clone holds
// the lowest free id (100), a second create gets an id no node has and
// no clone is ever sent to another node's id (issue 36 item 3). When the
// clone's temporary config shows (as qemu-server writes it first), the
// cluster's next id moves past 100 and past another node's 101-170 at
// once; when it never shows, the engine asks the cluster about each id
// after 100, a bounded number of them.
func TestVMIDPastAReservedOneAsksTheCluster(t *testing.T) {
	for _, c := range []struct {
		name       string
		foreign    []int
		tempConfig bool
		want       int
		maxChecks  int
	}{
		{"temporary config shows", span(101, 170), true, 171, 0},
		{"temporary config never shows", []int{101}, false, 102, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			g := apitest.NewGuests()
			cc := &clusterCloner{Proxmox: apitest.NewProxmox(g, map[string]int{"debian": 9000}), foreign: map[int]bool{}, tempConfig: c.tempConfig,
				parked: make(chan struct{}), release: make(chan struct{}), attempts: map[int]int{}}
			for _, id := range c.foreign {
				cc.foreign[id] = true
			}
			e, err := sandbox.New(sandbox.Options{Node: "node1", Proxmox: cc, Guests: g.Dial, StateDir: t.TempDir(), AgentTimeout: 5 * time.Second,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.Reconcile(ctx); err != nil {
				t.Fatal(err)
			}
			first := make(chan error, 1)
			go func() { _, err := e.Create(ctx, oneVM("debian")); first <- err }()
			select {
			case <-cc.parked:
			case <-ctx.Done():
				t.Fatal("the first clone never started")
			}
			sb, err := e.Create(ctx, oneVM("debian"))
			close(cc.release)
			if err != nil {
				t.Fatalf("second create while 100 is held: %v", err)
			}
			if got := sb.VMs[0].VMID; got != c.want {
				t.Errorf("second create's VM id %d, want %d", got, c.want)
			}
			if err := <-first; err != nil {
				t.Fatalf("first create: %v", err)
			}
			cc.mu.Lock()
			defer cc.mu.Unlock()
			for id := range cc.foreign {
				if n := cc.attempts[id]; n != 0 {
					t.Errorf("%d clones sent to another node's id %d", n, id)
				}
			}
			if cc.checks > c.maxChecks {
				t.Errorf("%d ids asked of the cluster, want at most %d", cc.checks, c.maxChecks)
			}
		})
	}
}

func span(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// takenCloner fails every clone in its task, and another user's VM (one
// the token cannot see) takes each id the clone was given.
type takenCloner struct {
	*apitest.Proxmox
	asked atomic.Int32 // VMIDFree calls
}

func (c *takenCloner) CloneVM(ctx context.Context, s sandbox.CloneSpec) error {
	return errors.New("clone 9000 to 100: task failed: storage error")
}

func (c *takenCloner) VMIDFree(ctx context.Context, id int) (bool, error) {
	c.asked.Add(1)
	return false, nil
}

// TestFailedCloneLeavesNoIDToWait: a clone whose task failed made nothing
// that stays (qemu-server cleans up), so its id is not recorded; when
// another user's invisible VM takes that id, the teardown does not wait
// on it, and the failed create leaves no SDN object behind.
func TestFailedCloneLeavesNoIDToWait(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := apitest.NewGuests()
	px := apitest.NewProxmox(g, map[string]int{"debian": 9000})
	tc := &takenCloner{Proxmox: px}
	e, err := sandbox.New(sandbox.Options{Node: "node1", Proxmox: tc, Guests: g.Dial, StateDir: t.TempDir(),
		AgentTimeout: 5 * time.Second, TeardownTimeout: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Create(ctx, oneVM("debian")); err == nil {
		t.Fatal("a create whose clone failed succeeded")
	}
	if l := e.List(); len(l) != 0 {
		t.Errorf("sandboxes after the failed create: %+v", l)
	}
	if z, v, s := px.SDNObjects(); z+v+s != 0 {
		t.Errorf("left: %d zones, %d vnets, %d subnets", z, v, s)
	}
	if n := tc.asked.Load(); n != 0 {
		t.Errorf("the teardown asked the cluster about the failed clone's id %d times: it was recorded", n)
	}
}

// rivalCloner is this node's Proxmox while another node's daemon creates
// as fast: the id the cluster's nextid answers is the one the other
// daemon clones to as well, and its clone lands first (this node's fails
// in pmxcfs, ErrExists).
type rivalCloner struct {
	*apitest.Proxmox
	mu      sync.Mutex
	foreign map[int]bool
	lost    int
}

// lowestLocked is the cluster's lowest free id; call with mu held.
func (c *rivalCloner) lowestLocked(ctx context.Context) (int, error) {
	return clusterNextID(ctx, c.Proxmox, c.foreign)
}

func (c *rivalCloner) NextID(ctx context.Context) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lowestLocked(ctx)
}

func (c *rivalCloner) CloneVM(ctx context.Context, s sandbox.CloneSpec) error {
	c.mu.Lock()
	lowest, err := c.lowestLocked(ctx)
	if err == nil && s.NewID == lowest {
		c.foreign[s.NewID] = true
		c.lost++
		c.mu.Unlock()
		return fmt.Errorf("clone: %w: close (rename) atomic file '/etc/pve/nodes/node1/qemu-server/%d.conf' failed: File exists", sandbox.ErrExists, s.NewID)
	}
	c.mu.Unlock()
	return c.Proxmox.CloneVM(ctx, s)
}

func (c *rivalCloner) VMIDFree(ctx context.Context, id int) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, local := c.VMByID(id)
	return !local && !c.foreign[id], nil
}

// TestVMIDCollisionsSpreadOut: another node's daemon takes every id the
// cluster's nextid answers, first. After its first clone lost, the create
// takes an id above the lowest free one, one the cluster says is free,
// and succeeds, instead of meeting the other daemon on the next lowest
// again until its retries run out (the three-node bed's 90 creates lost
// a create or two that way).
func TestVMIDCollisionsSpreadOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := apitest.NewGuests()
	rc := &rivalCloner{Proxmox: apitest.NewProxmox(g, map[string]int{"debian": 9000}), foreign: map[int]bool{}}
	e := nodeEngine(t, ctx, rc, g)
	for range 3 {
		sb, err := e.Create(ctx, oneVM("debian"))
		if err != nil {
			t.Fatalf("create while another node takes every lowest id: %v", err)
		}
		rc.mu.Lock()
		if id := sb.VMs[0].VMID; rc.foreign[id] {
			t.Errorf("VM id %d is the other node's", id)
		}
		rc.mu.Unlock()
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.lost != 3 {
		t.Errorf("%d clones lost their id, want one per create", rc.lost)
	}
}

// TestVMIDSpreadIntoTakenIDsFallsBack: a cluster whose ids have holes
// (VMs 101 to 200 but 110): the clone to the lowest free id, 100, loses
// it to another node's, and every id the spread may pick above the next
// lowest free one, 110, is taken. The create takes 110, as a create
// without the spread would, instead of failing once its checks run out;
// losing that one too, it goes on above the taken block.
func TestVMIDSpreadIntoTakenIDsFallsBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := apitest.NewGuests()
	rc := &rivalCloner{Proxmox: apitest.NewProxmox(g, map[string]int{"debian": 9000}), foreign: map[int]bool{}}
	for id := 101; id <= 200; id++ {
		rc.foreign[id] = id != 110
	}
	e := nodeEngine(t, ctx, rc, g)
	sb, err := e.Create(ctx, oneVM("debian"))
	if err != nil {
		t.Fatalf("create on a cluster with holes in its ids: %v", err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if id := sb.VMs[0].VMID; id <= 200 {
		t.Errorf("VM id %d: want one above the taken block", id)
	}
	if rc.lost != 2 {
		t.Errorf("%d clones lost their id, want 2 (100, then 110)", rc.lost)
	}
}

// nodeEngine is an engine of node1 over px and g, reconciled.
func nodeEngine(t *testing.T, ctx context.Context, px sandbox.Proxmox, g *apitest.Guests) *sandbox.Engine {
	t.Helper()
	e, err := sandbox.New(sandbox.Options{Node: "node1", Proxmox: px, Guests: g.Dial, StateDir: t.TempDir(), AgentTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	return e
}
