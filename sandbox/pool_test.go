package sandbox_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// fakeEgress records the policy in force per sandbox.
type fakeEgress struct {
	mu     sync.Mutex
	policy map[string]apitype.EgressPolicy
}

func (f *fakeEgress) Validate(apitype.EgressPolicy) error { return nil }

func (f *fakeEgress) Set(_ context.Context, sb, _ string, _ []string, p apitype.EgressPolicy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.policy[sb] = p
	return nil
}

func (f *fakeEgress) Remove(_ context.Context, sb, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.policy, sb)
	return nil
}

func (f *fakeEgress) Status(sb, _ string) apitype.EgressStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return apitype.EgressStatus{Sandbox: sb, Policy: f.policy[sb]}
}

func (f *fakeEgress) mode(sb string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.policy[sb].Mode
}

// slowApply makes ApplySDN take a while, so concurrent callers overlap.
type slowApply struct {
	*apitest.Proxmox
	delay time.Duration
}

func (s slowApply) ApplySDN(ctx context.Context) error {
	time.Sleep(s.delay)
	return s.Proxmox.ApplySDN(ctx)
}

// poolBed is an engine with a warm pool on the in-memory fakes.
type poolBed struct {
	e      *sandbox.Engine
	px     *apitest.Proxmox
	g      *apitest.Guests
	egress *fakeEgress
	o      sandbox.Options
}

func small(target int) sandbox.PoolShape {
	return sandbox.PoolShape{Name: "small", Template: "debian", Cores: 1, MemoryMiB: 512, Target: target, MaxAge: time.Hour}
}

func newPoolBed(t *testing.T, shapes []sandbox.PoolShape, mod func(*sandbox.Options)) *poolBed {
	t.Helper()
	g := apitest.NewGuests()
	b := &poolBed{px: apitest.NewProxmox(g, map[string]int{"debian": 9000, "alpine": 9001}), g: g, egress: &fakeEgress{policy: map[string]apitype.EgressPolicy{}}}
	b.o = sandbox.Options{Node: "node1", Proxmox: b.px, Guests: g.Dial, StateDir: t.TempDir(), AgentTimeout: 2 * time.Second,
		Egress: b.egress, WarmPool: shapes, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if mod != nil {
		mod(&b.o)
	}
	b.e = b.restart(t)
	return b
}

// restart builds a new engine on the same Proxmox and state directory (a
// daemon restart) and reconciles it.
func (b *poolBed) restart(t *testing.T) *sandbox.Engine {
	t.Helper()
	e, err := sandbox.New(b.o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e
}

func (b *poolBed) ready(shape string) int {
	for _, s := range b.e.Pool().Shapes {
		if s.Name == shape {
			return s.Ready
		}
	}
	return -1
}

func oneVMSized(template string, cores, mem int) apitype.CreateRequest {
	r := oneVM(template)
	r.VMs[0].Cores, r.VMs[0].MemoryMiB = cores, mem
	return r
}

// TestPoolClaimMatchesShape: only a request of exactly the shape claims a
// member; every other create is cold, and the member stays.
func TestPoolClaimMatchesShape(t *testing.T) {
	ctx := context.Background()
	b := newPoolBed(t, []sandbox.PoolShape{small(1)}, func(o *sandbox.Options) { o.SharedVNets = []string{"lab"} })
	b.e.MaintainPool(ctx)
	if n := b.ready("small"); n != 1 {
		t.Fatalf("%d members ready after a refill, want 1", n)
	}
	// a vnet the operator made and shares: a member never has a NIC there
	for _, err := range []error{b.px.CreateZone(ctx, sandbox.ZoneSpec{ID: "opzone"}), b.px.CreateVNet(ctx, sandbox.VNetSpec{ID: "lab", Zone: "opzone"}),
		b.px.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "lab", CIDR: "10.88.0.0/24", Gateway: "10.88.0.1"})} {
		if err != nil {
			t.Fatal(err)
		}
	}
	shared := oneVMSized("debian", 1, 512)
	shared.VMs[0].NICs = []apitype.NIC{{Network: "net0"}, {VNet: "lab"}}
	shared.VMs[0].Networks = []string{"net0", apitype.SharedNetwork("lab")}
	twoNets := oneVMSized("debian", 1, 512)
	twoNets.Networks = append(twoNets.Networks, apitype.NetworkRequest{Name: "net1", CIDR: "auto"})
	fixed := oneVMSized("debian", 1, 512)
	fixed.Networks[0].CIDR = "192.168.77.0/24"
	disk := oneVMSized("debian", 1, 512)
	disk.VMs[0].DiskGiB = 20
	named := oneVMSized("debian", 1, 512)
	named.Networks[0].Name = "lan"
	named.VMs[0].Networks = []string{"lan"}
	egress := oneVMSized("debian", 1, 512)
	egress.Egress = &apitype.EgressPolicy{Mode: "none"}
	off := false
	nodhcp := oneVMSized("debian", 1, 512)
	nodhcp.Networks[0].DHCP = &off
	mac := oneVMSized("debian", 1, 512)
	mac.VMs[0].NICs = []apitype.NIC{{Network: "net0", MAC: "02:00:00:00:00:01"}}
	cpu := oneVMSized("debian", 1, 512)
	cpu.VMs[0].CPU = "host"
	ranges := oneVMSized("debian", 1, 512)
	ranges.Networks[0].CIDR = "192.168.78.0/24"
	ranges.Networks[0].DHCPRanges = []apitype.DHCPRange{{Start: "192.168.78.50", End: "192.168.78.100"}}
	// the API refuses ranges on an "auto" cidr; the engine's match must
	// not take them for the plan's all the same
	autoRanges := oneVMSized("debian", 1, 512)
	autoRanges.Networks[0].DHCPRanges = []apitype.DHCPRange{{Start: "10.0.0.50", End: "10.0.0.100"}}
	// a default written out is an option too: a member's hardware was
	// never set from it
	nicDefault := oneVMSized("debian", 1, 512)
	nicDefault.VMs[0].NICController = "virtio"
	// a member's agent answered its refill's ping: a VM without one is
	// never one
	noAgent := oneVMSized("debian", 1, 512)
	noAgent.VMs[0].Agent = new(bool)
	// a member's VM is on the shape's networks: a VM without any NIC
	// (its networks empty, which the match would read as the default)
	// is never one
	noNetwork := oneVMSized("debian", 1, 512)
	noNetwork.VMs[0].NoNetwork, noNetwork.VMs[0].Networks = true, []string{}
	for name, req := range map[string]apitype.CreateRequest{
		"other template": oneVMSized("alpine", 1, 512), "more cores": oneVMSized("debian", 2, 512), "more memory": oneVMSized("debian", 1, 1024),
		"two networks": twoNets, "fixed cidr": fixed, "disk resize": disk, "other network name": named, "other egress kind": egress, "no dhcp": nodhcp,
		"a fixed MAC": mac, "a cpu model": cpu, "an explicit nic controller": nicDefault, "dhcp ranges": ranges, "dhcp ranges on auto": autoRanges,
		"a NIC on a shared vnet": shared, "a VM without a guest agent": noAgent, "a VM without any NIC": noNetwork,
	} {
		sb, err := b.e.Create(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if sb.FromPool {
			t.Errorf("%s: claimed from the pool (%s)", name, sb.ID)
		}
		if n := b.ready("small"); n != 1 {
			t.Errorf("%s: %d members ready, want the one still there", name, n)
		}
	}
	req := oneVMSized("debian", 1, 512)
	req.Owner, req.Labels, req.Env = "alice", map[string]string{"eval": "ctf"}, map[string]string{"KEY": "v"}
	agent := true
	req.VMs[0].Agent = &agent // the default written out still matches
	sb, err := b.e.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !sb.FromPool || sb.Owner != "alice" || sb.Labels["eval"] != "ctf" || sb.State != apitype.StateReady {
		t.Errorf("matching create: %+v, want a ready sandbox from the pool with owner and labels", sb)
	}
	var types []string
	for _, e := range b.e.EventsSince(0, sandbox.NewEventFilter("alice", nil, nil)).Events {
		if e.Sandbox == sb.ID {
			types = append(types, e.Type)
		}
	}
	if strings.Join(types, ",") != apitype.EventCreated+","+apitype.EventReady {
		t.Errorf("events of the claimed sandbox %v, want created and ready, as a cold create has", types)
	}
	if got := sb.ExpiresAt.Sub(sb.CreatedAt); got != 60*time.Second {
		t.Errorf("claimed sandbox lives %s, want its request's TTL 60s", got)
	}
	vm, _ := b.px.VMByID(sb.VMs[0].VMID)
	if slices.Contains(vm.Info.Tags, "pvei-pool") || !slices.Contains(vm.Info.Tags, "pvei-s-"+sb.ID) || vm.Info.Name != "pvei-"+sb.ID+"-vm0" {
		t.Errorf("claimed VM tags %v, name %q: want the sandbox's tags and name, no pool tag", vm.Info.Tags, vm.Info.Name)
	}
	if n := b.ready("small"); n != 0 {
		t.Errorf("%d members ready after the claim, want 0", n)
	}
}

// TestPoolClaimNoSDNApply: a claim makes no SDN apply and no clone, and
// the claim's egress policy is in force when Create returns (the member
// waited with "none").
func TestPoolClaimNoSDNApply(t *testing.T) {
	ctx := context.Background()
	b := newPoolBed(t, []sandbox.PoolShape{small(2)}, nil)
	b.e.MaintainPool(ctx)
	members := b.e.Pool().Members
	if len(members) != 2 {
		t.Fatalf("members %+v, want 2", members)
	}
	for _, m := range members {
		if got := b.egress.mode(m.ID); got != "none" {
			t.Errorf("member %s waits with egress %q, want none", m.ID, got)
		}
	}
	applies, clones := b.px.Calls["ApplySDN"], b.px.Calls["CloneVM"]
	sb, err := b.e.Create(ctx, oneVMSized("debian", 1, 512))
	if err != nil {
		t.Fatal(err)
	}
	if !sb.FromPool {
		t.Fatal("the create was not claimed from the pool")
	}
	if got := b.egress.mode(sb.ID); got != "open" {
		t.Errorf("claimed sandbox's egress %q when Create returned, want open", got)
	}
	if d := b.px.Calls["ApplySDN"] - applies; d != 0 {
		t.Errorf("a claim made %d SDN applies, want 0", d)
	}
	if d := b.px.Calls["CloneVM"] - clones; d != 0 {
		t.Errorf("a claim made %d clones, want 0", d)
	}
	if _, ok := b.e.Get(sb.ID); !ok {
		t.Error("the claimed sandbox is not visible")
	}
	for _, m := range b.e.Pool().Members {
		if _, ok := b.e.Get(m.ID); ok {
			t.Errorf("member %s is visible as a sandbox", m.ID)
		}
		for _, s := range b.e.List() {
			if s.ID == m.ID {
				t.Errorf("member %s is listed as a sandbox", m.ID)
			}
		}
	}
}

// TestPoolConcurrentClaims: claims racing for a pool of 4 never get the
// same member; the creates beyond it run cold.
func TestPoolConcurrentClaims(t *testing.T) {
	ctx := context.Background()
	b := newPoolBed(t, []sandbox.PoolShape{small(4)}, nil)
	b.e.MaintainPool(ctx)
	pool := map[string]bool{}
	for _, m := range b.e.Pool().Members {
		pool[m.ID] = true
	}
	const n = 8
	out := make([]apitype.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); out[i], errs[i] = b.e.Create(ctx, oneVMSized("debian", 1, 512)) }()
	}
	wg.Wait()
	seen := map[string]bool{}
	hits := 0
	for i, sb := range out {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if seen[sb.ID] {
			t.Errorf("sandbox %s handed out twice", sb.ID)
		}
		seen[sb.ID] = true
		if sb.FromPool {
			hits++
			if !pool[sb.ID] {
				t.Errorf("claim %s is not one of the members %v", sb.ID, pool)
			}
		}
	}
	if hits != 4 {
		t.Errorf("%d claims hit, want 4 (the pool's size)", hits)
	}
}

// TestPoolRefillOneApply: the pool refills to its target, and one refill
// of many members makes one SDN apply.
func TestPoolRefillOneApply(t *testing.T) {
	ctx := context.Background()
	b := newPoolBed(t, []sandbox.PoolShape{small(3), {Name: "big", Template: "alpine", Cores: 2, MemoryMiB: 2048, Target: 2}}, nil)
	before := b.px.Calls["ApplySDN"]
	b.e.MaintainPool(ctx)
	if d := b.px.Calls["ApplySDN"] - before; d != 1 {
		t.Errorf("a refill of 5 members made %d SDN applies, want 1", d)
	}
	if b.ready("small") != 3 || b.ready("big") != 2 {
		t.Fatalf("pool %+v, want 3 small and 2 big ready", b.e.Pool().Shapes)
	}
	for range 2 {
		if _, err := b.e.Create(ctx, oneVMSized("debian", 1, 512)); err != nil {
			t.Fatal(err)
		}
	}
	if b.ready("small") != 1 {
		t.Fatalf("%d small ready after two claims, want 1", b.ready("small"))
	}
	b.e.MaintainPool(ctx)
	if b.ready("small") != 3 || b.ready("big") != 2 {
		t.Errorf("pool %+v after the refill, want 3 small and 2 big ready", b.e.Pool().Shapes)
	}
}

// TestPoolGivesWay: with the node full of members, a cold create gets
// room by retiring members, and a refill never goes past the caps.
func TestPoolGivesWay(t *testing.T) {
	ctx := context.Background()
	b := newPoolBed(t, []sandbox.PoolShape{small(3)}, func(o *sandbox.Options) { o.Caps = sandbox.Caps{NodeVMs: 3} })
	b.e.MaintainPool(ctx)
	if n := b.ready("small"); n != 3 {
		t.Fatalf("%d ready, want 3", n)
	}
	sb, err := b.e.Create(ctx, oneVMSized("alpine", 1, 512))
	if err != nil {
		t.Fatalf("cold create on a node full of members: %v", err)
	}
	if sb.FromPool {
		t.Fatal("an alpine create was claimed from a debian pool")
	}
	if n := len(b.e.Pool().Members); n != 2 {
		t.Errorf("%d members after the cold create, want 2 (one gave way)", n)
	}
	b.e.MaintainPool(ctx)
	if n := len(b.e.Pool().Members); n != 2 {
		t.Errorf("%d members after a refill on a full node, want 2 (the caps hold)", n)
	}
	if n := len(b.px.VMIDs()); n > 3 {
		t.Errorf("%d VMs in Proxmox, want at most the cap of 3", n)
	}
	// Full of sandboxes: the create is refused with the cap.
	for range 2 {
		if _, err := b.e.Create(ctx, oneVMSized("alpine", 1, 512)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.e.Create(ctx, oneVMSized("alpine", 1, 512)); err == nil {
		t.Error("a create past the cap with no member left succeeded")
	}
}

// TestPoolRestart: a restart re-adopts the members and keeps the claimed
// sandbox a sandbox; the new engine never hands out a member twice.
func TestPoolRestart(t *testing.T) {
	ctx := context.Background()
	b := newPoolBed(t, []sandbox.PoolShape{small(3)}, nil)
	b.e.MaintainPool(ctx)
	claimed, err := b.e.Create(ctx, oneVMSized("debian", 1, 512))
	if err != nil || !claimed.FromPool {
		t.Fatalf("claim: %+v, %v", claimed, err)
	}
	left := b.e.Pool().Members
	e2 := b.restart(t)
	after := e2.Pool().Members
	if len(after) != len(left) {
		t.Fatalf("after a restart %d members, want the %d there were", len(after), len(left))
	}
	for i := range after {
		if after[i].ID != left[i].ID || after[i].State != apitype.StateReady {
			t.Errorf("member %d after restart: %+v, want %+v ready", i, after[i], left[i])
		}
	}
	if sb, ok := e2.Get(claimed.ID); !ok || !sb.FromPool || sb.State != apitype.StateReady {
		t.Errorf("claimed sandbox after a restart: %+v %v", sb, ok)
	}
	got := map[string]bool{claimed.ID: true}
	for range len(left) {
		sb, err := e2.Create(ctx, oneVMSized("debian", 1, 512))
		if err != nil || !sb.FromPool {
			t.Fatalf("claim after restart: %+v %v", sb, err)
		}
		if got[sb.ID] {
			t.Errorf("%s handed out twice across the restart", sb.ID)
		}
		got[sb.ID] = true
	}
	// Nothing leaked: every VM belongs to a sandbox (templates aside).
	if n := len(b.px.VMIDs()); n != len(got) {
		t.Errorf("%d VMs, want the %d sandboxes'", n, len(got))
	}
}

// TestPoolRestartDropsRetagged: a member whose VM lost the pool tag (or
// stopped) while the daemon was down is torn down, not re-adopted.
func TestPoolRestartDropsRetagged(t *testing.T) {
	ctx := context.Background()
	b := newPoolBed(t, []sandbox.PoolShape{small(2)}, nil)
	b.e.MaintainPool(ctx)
	m := b.e.Pool().Members
	if len(m) != 2 {
		t.Fatalf("members %+v", m)
	}
	if err := b.px.SetVMTags(ctx, m[0].VMIDs[0], "x", []string{"pvei-n-node1", "pvei-s-" + m[0].ID}); err != nil {
		t.Fatal(err)
	}
	if err := b.px.StopVM(ctx, m[1].VMIDs[0]); err != nil {
		t.Fatal(err)
	}
	e2 := b.restart(t)
	if got := e2.Pool().Members; len(got) != 0 {
		t.Errorf("members after restart %+v, want none (retagged, stopped)", got)
	}
	for _, x := range m {
		if _, ok := b.px.VMByID(x.VMIDs[0]); ok {
			t.Errorf("VM %d of dropped member %s still exists", x.VMIDs[0], x.ID)
		}
	}
}

// TestPoolReplaces: members past their maximum age, whose template changed
// or found broken are retired and replaced.
func TestPoolReplaces(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	b := newPoolBed(t, []sandbox.PoolShape{small(2)}, func(o *sandbox.Options) { o.Now = clock })
	ids := func() []string {
		var out []string
		for _, m := range b.e.Pool().Members {
			if m.State == apitype.StateReady {
				out = append(out, m.ID)
			}
		}
		return out
	}
	b.e.MaintainPool(ctx)
	first := ids()
	for _, tc := range []struct {
		name  string
		spoil func(members []apitype.PoolMember)
		gone  int
	}{
		{"broken: VM stopped", func(ms []apitype.PoolMember) { _ = b.px.StopVM(ctx, ms[0].VMIDs[0]) }, 1},
		{"broken: agent gone", func(ms []apitype.PoolMember) { b.g.PingFails[ms[0].VMIDs[0]] = true }, 1},
		{"max age", func([]apitype.PoolMember) { mu.Lock(); now = now.Add(2 * time.Hour); mu.Unlock() }, 2},
		{"template changed", func([]apitype.PoolMember) {
			b.px.AddVM(sandbox.VMInfo{VMID: 9100, Name: "debian", Template: true})
			b.px.VMs[9000].Info.Name = "debian-old"
		}, 2},
	} {
		before := b.e.Pool().Members
		tc.spoil(before)
		b.e.MaintainPool(ctx)
		// A replacement may get the retired VM's id back (Proxmox reuses
		// ids): the broken agent goes with the VM, as it would.
		clear(b.g.PingFails)
		b.e.MaintainPool(ctx)
		after := ids()
		if len(after) != 2 {
			t.Errorf("%s: %d ready after maintenance, want 2", tc.name, len(after))
		}
		kept := 0
		for _, m := range before {
			if slices.Contains(after, m.ID) {
				kept++
			}
		}
		if kept != 2-tc.gone {
			t.Errorf("%s: kept %d of %v in %v, want %d replaced", tc.name, kept, before, after, tc.gone)
		}
	}
	if slices.Equal(first, ids()) {
		t.Error("nothing was replaced")
	}
	for _, m := range b.e.Pool().Members {
		vm, _ := b.px.VMByID(m.VMIDs[0])
		if want := []string{"pvei-n-node1", "pvei-s-" + m.ID, "pvei-pool"}; !slices.Equal(vm.Info.Tags, want) {
			t.Errorf("member VM %d tags %v, want %v", m.VMIDs[0], vm.Info.Tags, want)
		}
	}
}

// TestSDNApplyCoalesced: concurrent cold creates share SDN applies.
func TestSDNApplyCoalesced(t *testing.T) {
	ctx := context.Background()
	g := apitest.NewGuests()
	px := apitest.NewProxmox(g, map[string]int{"debian": 9000})
	e, err := sandbox.New(sandbox.Options{Node: "node1", Proxmox: slowApply{px, 200 * time.Millisecond}, Guests: g.Dial, StateDir: t.TempDir(),
		AgentTimeout: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 6
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); _, errs[i] = e.Create(ctx, oneVM("debian")) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := px.Calls["ApplySDN"]; got > 3 || got < 1 {
		t.Errorf("%d concurrent creates made %d SDN applies, want 1 to 3", n, got)
	}
	if zones, _, _ := px.SDNObjects(); zones != n || px.Pending {
		t.Errorf("%d zones, pending %v: every create's zone applied", zones, px.Pending)
	}
}

// TestPoolMetrics: members ready per shape, claims that hit and missed,
// refill times and SDN applies are exported, and the names pass promlint.
func TestPoolMetrics(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	b := newPoolBed(t, []sandbox.PoolShape{small(2)}, func(o *sandbox.Options) { o.Registerer = reg })
	b.e.MaintainPool(ctx)
	for range 3 { // two hits, then a miss
		if _, err := b.e.Create(ctx, oneVMSized("debian", 1, 512)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.e.Create(ctx, oneVMSized("alpine", 1, 512)); err != nil { // no shape
		t.Fatal(err)
	}
	b.e.MaintainPool(ctx)
	want := `
# HELP pve_inspect_pool_claims_total Creates that asked the warm pool, by shape and result (hit: claimed a member; miss: the shape had none ready; unmatched: no shape, shape empty).
# TYPE pve_inspect_pool_claims_total counter
pve_inspect_pool_claims_total{result="hit",shape="small"} 2
pve_inspect_pool_claims_total{result="miss",shape="small"} 1
pve_inspect_pool_claims_total{result="unmatched",shape=""} 1
# HELP pve_inspect_pool_members Warm pool members by shape and state (ready: claimable; building: being cloned and booted).
# TYPE pve_inspect_pool_members gauge
pve_inspect_pool_members{shape="small",state="building"} 0
pve_inspect_pool_members{shape="small",state="ready"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pve_inspect_pool_claims_total", "pve_inspect_pool_members"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "pve_inspect_pool_refill_seconds"); n != 1 {
		t.Errorf("%d refill_seconds series, want 1", n)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "pve_inspect_pool_refill_seconds" && mf.GetMetric()[0].GetHistogram().GetSampleCount() != 4 {
			t.Errorf("refill_seconds counted %d members, want 4 (2, then 2 more)", mf.GetMetric()[0].GetHistogram().GetSampleCount())
		}
		if mf.GetName() == "pve_inspect_sdn_applies_total" && mf.GetMetric()[0].GetCounter().GetValue() < 3 {
			t.Errorf("sdn_applies_total %v, want at least the 2 refills' and the cold create's", mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// TestPoolClaimFailureRunsCold: a claim whose member fails (here the tag
// update) tears that member down and the create runs cold; the member is
// never handed out.
func TestPoolClaimFailureRunsCold(t *testing.T) {
	ctx := context.Background()
	b := newPoolBed(t, []sandbox.PoolShape{small(1)}, nil)
	b.e.MaintainPool(ctx)
	member := b.e.Pool().Members[0]
	b.px.FailOnce("SetVMTags", errors.New("boom"))
	sb, err := b.e.Create(ctx, oneVMSized("debian", 1, 512))
	if err != nil {
		t.Fatal(err)
	}
	if sb.FromPool || sb.ID == member.ID {
		t.Errorf("create after a failed claim: %+v, want a cold sandbox", sb)
	}
	if _, ok := b.px.VMByID(member.VMIDs[0]); ok && member.VMIDs[0] != sb.VMs[0].VMID {
		t.Errorf("the failed member's VM %d is still there", member.VMIDs[0])
	}
	if _, ok := b.e.Get(member.ID); ok || len(b.e.Pool().Members) != 0 {
		t.Errorf("the failed member is still known: %+v", b.e.Pool().Members)
	}
}

// TestPoolShutdownMidRefill: a refill cut short by the daemon's shutdown
// leaves its members to the next start, which tears them down (nothing
// leaks, nothing half-built is handed out).
func TestPoolShutdownMidRefill(t *testing.T) {
	b := newPoolBed(t, []sandbox.PoolShape{small(2)}, nil)
	b.g.PingFails[100], b.g.PingFails[101] = true, true // the agents never answer: the build waits
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.e.MaintainPool(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for len(b.px.VMIDs()) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the refill cloned nothing")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if n := len(b.px.VMIDs()); n != 2 {
		t.Errorf("%d VMs right after the shutdown, want the 2 half-built ones left for the next start", n)
	}
	clear(b.g.PingFails)
	e2 := b.restart(t)
	if m := e2.Pool().Members; len(m) != 0 {
		t.Errorf("members after the restart %+v, want none re-adopted", m)
	}
	if n := len(b.px.VMIDs()); n != 0 {
		t.Errorf("%d VMs after the restart, want the half-built members torn down", n)
	}
}
