package sandbox_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
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
	foreign  map[int]bool
	parked   chan struct{}
	release  chan struct{}
	mu       sync.Mutex
	attempts map[int]int
}

func (c *clusterCloner) CloneVM(ctx context.Context, s sandbox.CloneSpec) error {
	c.mu.Lock()
	c.attempts[s.NewID]++
	c.mu.Unlock()
	if c.foreign[s.NewID] {
		return fmt.Errorf("clone: %w: close (rename) atomic file '/etc/pve/nodes/node1/qemu-server/%d.conf' failed: File exists", sandbox.ErrExists, s.NewID)
	}
	if s.NewID == 100 {
		c.parked <- struct{}{}
		<-c.release
	}
	return c.Proxmox.CloneVM(ctx, s)
}

func (c *clusterCloner) VMIDFree(ctx context.Context, id int) (bool, error) {
	_, local := c.VMByID(id)
	return !local && !c.foreign[id], nil
}

// TestVMIDPastAReservedOneAsksTheCluster: while one create's clone holds
// the lowest free id (100), a second create takes the next id only once
// the cluster says it is free: 101 is another node's VM, so it gets 102,
// and no clone is ever sent to 101 (issue 36 item 3).
func TestVMIDPastAReservedOneAsksTheCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := apitest.NewGuests()
	cc := &clusterCloner{Proxmox: apitest.NewProxmox(g, map[string]int{"debian": 9000}), foreign: map[int]bool{101: true},
		parked: make(chan struct{}), release: make(chan struct{}), attempts: map[int]int{}}
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
		t.Fatalf("second create while 100 is reserved and 101 is another node's: %v", err)
	}
	if got := sb.VMs[0].VMID; got != 102 {
		t.Errorf("second create's VM id %d, want 102", got)
	}
	if err := <-first; err != nil {
		t.Fatalf("first create: %v", err)
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if n := cc.attempts[101]; n != 0 {
		t.Errorf("%d clones sent to another node's id 101", n)
	}
}
