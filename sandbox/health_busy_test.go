package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// busyPingGuest fails its ping with the daemon's own "node busy" refusal
// while busy is set: what qga's Ping returns (mapErr: ErrBudget ->
// sandbox.ErrBusy) while the node-wide buffer budget is held by other
// owners' guests (TestReviewUnownedCallsTakeOtherOwnersShare in qga).
type busyPingGuest struct {
	sandbox.Guest
	busy   *atomic.Bool
	owners *ownerLog
}

// ownerLog records the owner each guest call's context is marked with.
type ownerLog struct {
	mu     sync.Mutex
	owners map[string]int // owner ("<none>" when unmarked) -> calls
}

func (l *ownerLog) add(ctx context.Context) {
	o, ok := sandbox.OwnerOf(ctx)
	if !ok {
		o = "<none>"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.owners[o]++
}

func (g busyPingGuest) Filesystems(ctx context.Context) ([]apitype.GuestFilesystem, error) {
	g.owners.add(ctx)
	return nil, nil
}

func (g busyPingGuest) Ping(ctx context.Context) error {
	g.owners.add(ctx)
	if g.busy.Load() {
		return fmt.Errorf("%w: qga 100.qga guest-sync-delimited: node-wide budget of buffered guest bytes exhausted", sandbox.ErrBusy)
	}
	return g.Guest.Ping(ctx)
}

// TestBusyNodeKeepsOtherOwnersSandboxesServing: a ping the daemon itself
// refused (sandbox.ErrBusy: the node-wide qga budget is full, or
// ErrOwnerBusy) is no verdict on the guest: the round keeps the last
// verdict and counts no silence, so 30 s of a busy node leave bob's
// healthy sandbox ok and serving, and the refusals are counted. The
// monitor is not blinded for good: once the node is free, an agent that
// really stops answering turns broken after AgentBrokenAfter. Every call
// the monitor makes into the guest is charged to the sandbox's owner.
func TestBusyNodeKeepsOtherOwnersSandboxesServing(t *testing.T) {
	var busy atomic.Bool
	owners := &ownerLog{owners: map[string]int{}}
	reg := prometheus.NewRegistry()
	g := apitest.NewGuests()
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	node := &nodeStats{st: map[int]sandbox.VMStats{}}
	px := apitest.NewProxmox(g, map[string]int{"debian": 9000})
	e := newEngine(t, func(o *sandbox.Options) {
		o.Proxmox = px
		o.Guests = func(s string) sandbox.Guest { return busyPingGuest{Guest: g.Dial(s), busy: &busy, owners: owners} }
		o.Now = clk.now
		o.Registerer = reg
		o.Health = sandbox.HealthOptions{Node: node, AgentBrokenAfter: 20 * time.Second, OOMWindow: time.Minute, ExpiringSoon: time.Minute}
	})
	req := oneVM("debian")
	req.Owner = "bob"
	req.TTLSeconds = 600
	sb, err := e.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	e.CheckHealth(context.Background())
	busy.Store(true) // mallory's guests hold the node's buffer budget
	for range 6 {
		clk.add(5 * time.Second)
		e.CheckHealth(context.Background())
	}
	h, _ := e.Health(sb.ID)
	berr := e.Broken(sb.ID, "")
	t.Logf("bob's sandbox after 30 s of a busy node: %s (%s); guest calls: %v", h.State, h.Reason, berr)
	if h.State == apitype.HealthBroken || berr != nil {
		var be *sandbox.BrokenError
		t.Errorf("bob's healthy sandbox turned %s/%s because the daemon's own budget was full (broken error: %v)", h.State, h.Reason, errors.As(berr, &be))
	}
	if n := counterValue(t, reg, "pve_inspect_sandbox_health_pings_refused_busy_total", "bob"); n != 6 {
		t.Errorf("busy pings counted for bob: %v, want 6", n)
	}
	// the node is free again; the agent really stops answering
	busy.Store(false)
	g.SetPingFails(sb.VMs[0].VMID, true)
	for range 3 {
		clk.add(5 * time.Second)
		e.CheckHealth(context.Background())
	}
	if h, _ := e.Health(sb.ID); h.State == apitype.HealthBroken {
		t.Errorf("broken after 15 s of silence (AgentBrokenAfter 20 s): the busy rounds counted as silence")
	}
	for range 3 {
		clk.add(5 * time.Second)
		e.CheckHealth(context.Background())
	}
	if h, _ := e.Health(sb.ID); h.State != apitype.HealthBroken || h.Reason != apitype.ReasonAgentUnresponsive {
		t.Errorf("after 30 s of real silence: %s/%s, want broken/%s", h.State, h.Reason, apitype.ReasonAgentUnresponsive)
	}
	owners.mu.Lock()
	defer owners.mu.Unlock()
	if len(owners.owners) != 1 || owners.owners["bob"] == 0 {
		t.Errorf("the health monitor's guest calls were charged to %v, want bob only", owners.owners)
	}
}

// counterValue returns the value of counter vector name's series with
// the one label value v (0 when there is none).
func counterValue(t *testing.T, reg *prometheus.Registry, name, v string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == name && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == v {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// ownedPingGuest records the owner of each ping's context.
type ownedPingGuest struct {
	sandbox.Guest
	owners *ownerLog
}

func (g ownedPingGuest) Ping(ctx context.Context) error {
	g.owners.add(ctx)
	return g.Guest.Ping(ctx)
}

// TestPoolGuestCallsChargedToAnOwner: the pool's own calls into its
// members (the build's and the refill check's pings) are charged to
// sandbox.PoolOwner, no tenant's share and never no owner; once a member
// is claimed, the claim's ping is charged to the claimant.
func TestPoolGuestCallsChargedToAnOwner(t *testing.T) {
	ctx := context.Background()
	owners := &ownerLog{owners: map[string]int{}}
	b := newPoolBed(t, []sandbox.PoolShape{small(1)}, func(o *sandbox.Options) {
		dial := o.Guests
		o.Guests = func(s string) sandbox.Guest { return ownedPingGuest{Guest: dial(s), owners: owners} }
	})
	b.e.MaintainPool(ctx) // builds the member
	b.e.MaintainPool(ctx) // checks it
	owners.mu.Lock()
	got := maps.Clone(owners.owners)
	clear(owners.owners)
	owners.mu.Unlock()
	if len(got) != 1 || got[sandbox.PoolOwner] < 2 {
		t.Errorf("pool pings charged to %v, want %s only (the build's and the check's)", got, sandbox.PoolOwner)
	}
	req := oneVMSized("debian", 1, 512)
	req.Owner = "alice"
	sb, err := b.e.Create(ctx, req)
	if err != nil || !sb.FromPool {
		t.Fatalf("claim: %+v, %v", sb, err)
	}
	owners.mu.Lock()
	defer owners.mu.Unlock()
	if len(owners.owners) != 1 || owners.owners["alice"] == 0 {
		t.Errorf("the claim's pings charged to %v, want alice only", owners.owners)
	}
}
