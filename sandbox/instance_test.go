package sandbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// pingGate holds the health monitor's pings while it is closed: each held
// ping says so on entered, and all go on when open is called.
type pingGate struct {
	mu      sync.Mutex
	wait    chan struct{} // nil: pings pass
	entered chan struct{}
}

func (p *pingGate) close() {
	p.mu.Lock()
	p.wait, p.entered = make(chan struct{}), make(chan struct{}, 16)
	p.mu.Unlock()
}

func (p *pingGate) open() {
	p.mu.Lock()
	close(p.wait)
	p.wait = nil
	p.mu.Unlock()
}

// gatedGuest is a guest whose pings pass through a pingGate.
type gatedGuest struct {
	sandbox.Guest
	gate *pingGate
}

func (g gatedGuest) Ping(ctx context.Context) error {
	g.gate.mu.Lock()
	wait, entered := g.gate.wait, g.gate.entered
	g.gate.mu.Unlock()
	if wait != nil {
		entered <- struct{}{}
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.Guest.Ping(ctx)
}

// TestInstanceStateDroppedOnDelete: what the health monitor keeps of a
// sandbox (its health, its per-sandbox series, its event state) goes with
// the delete itself, not at the next round, also when the delete lands
// while a round is checking the sandbox; the next sandbox on the same
// VMID starts with nothing of it.
func TestInstanceStateDroppedOnDelete(t *testing.T) {
	ctx := context.Background()
	g := apitest.NewGuests()
	px := apitest.NewProxmox(g, map[string]int{"debian": 9000})
	reg := prometheus.NewRegistry()
	gate := &pingGate{}
	e := newEngine(t, func(o *sandbox.Options) {
		o.Proxmox = px
		o.Guests = func(s string) sandbox.Guest { return gatedGuest{Guest: g.Dial(s), gate: gate} }
		o.Registerer = reg
		o.Health = sandbox.HealthOptions{Node: &nodeStats{st: map[int]sandbox.VMStats{}}, PingTimeout: 10 * time.Second}
	})
	series := func() int {
		t.Helper()
		n, err := testutil.GatherAndCount(reg, "pve_inspect_sandbox_vm_cpu_seconds_total", "pve_inspect_sandbox_vm_memory_bytes",
			"pve_inspect_sandbox_vm_network_bytes_total", "pve_inspect_sandbox_vm_health")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	a, err := e.Create(ctx, oneVM("debian"))
	if err != nil {
		t.Fatal(err)
	}
	e.CheckHealth(ctx)
	if h, ok := e.Health(a.ID); !ok || h.State != apitype.HealthOK || series() == 0 {
		t.Fatalf("A before its delete: health %+v %v, %d series", h, ok, series())
	}
	if err := e.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if h, ok := e.Health(a.ID); ok || series() != 0 {
		t.Fatalf("A right after its delete: health %+v, %d series; want none", h, series())
	}

	b, err := e.Create(ctx, oneVM("debian"))
	if err != nil {
		t.Fatal(err)
	}
	if b.VMs[0].VMID != a.VMs[0].VMID {
		t.Fatalf("B got VMID %d, A had %d: the test needs the reused VMID", b.VMs[0].VMID, a.VMs[0].VMID)
	}
	if h, ok := e.Health(b.ID); ok || series() != 0 {
		t.Fatalf("B before its first round: health %+v, %d series; want none", h, series())
	}
	// B is deleted while a round checks it: the round ends without
	// bringing B's track (or its series) back.
	gate.close()
	round := make(chan struct{})
	go func() { defer close(round); e.CheckHealth(ctx) }()
	<-gate.entered
	if err := e.Delete(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	gate.open()
	<-round
	if h, ok := e.Health(b.ID); ok || series() != 0 {
		t.Fatalf("B after a delete during a round: health %+v, %d series; want none", h, series())
	}
}
