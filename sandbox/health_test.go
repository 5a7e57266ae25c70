package sandbox_test

import (
	"context"
	"errors"
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

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// nodeStats is a settable NodeStats: st holds VMs' counters, ct
// containers' (each kind read through its own call).
type nodeStats struct {
	mu sync.Mutex
	st map[int]sandbox.VMStats
	ct map[int]sandbox.VMStats
}

func (n *nodeStats) VMStats(vmid, _ int) sandbox.VMStats { return n.get(n.st, vmid, "taps") }
func (n *nodeStats) CTStats(vmid, _ int) sandbox.VMStats { return n.get(n.ct, vmid, "veths") }

// get returns vmid's counters in m, or none with its cgroup and ports
// missing.
func (n *nodeStats) get(m map[int]sandbox.VMStats, vmid int, ports string) sandbox.VMStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := m[vmid]
	if !ok {
		return sandbox.VMStats{Missing: []string{"cgroup", ports}}
	}
	return st
}

func (n *nodeStats) set(vmid int, st sandbox.VMStats) {
	n.mu.Lock()
	n.st[vmid] = st
	n.mu.Unlock()
}

// fsGuest adds a guest-reported filesystem to a fake guest.
type fsGuest struct {
	sandbox.Guest
	fs *fsReport
}

type fsReport struct {
	mu   sync.Mutex
	used uint64
}

func (g fsGuest) Filesystems(context.Context) ([]apitype.GuestFilesystem, error) {
	g.fs.mu.Lock()
	defer g.fs.mu.Unlock()
	return []apitype.GuestFilesystem{{Mountpoint: "/", Type: "ext4", UsedBytes: g.fs.used, TotalBytes: 100}}, nil
}

type healthBed struct {
	e     *sandbox.Engine
	px    *apitest.Proxmox
	g     *apitest.Guests
	clk   *clock
	node  *nodeStats
	fs    *fsReport
	reg   *prometheus.Registry
	sb    apitype.Sandbox
	vmid  int
	owner string
}

func newHealthBed(t *testing.T) *healthBed {
	t.Helper()
	b := &healthBed{g: apitest.NewGuests(), clk: &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
		node: &nodeStats{st: map[int]sandbox.VMStats{}}, fs: &fsReport{used: 10}, reg: prometheus.NewRegistry(), owner: "alice"}
	b.px = apitest.NewProxmox(b.g, map[string]int{"debian": 9000})
	b.e = newEngine(t, func(o *sandbox.Options) {
		o.Proxmox = b.px
		o.Guests = func(s string) sandbox.Guest { return fsGuest{Guest: b.g.Dial(s), fs: b.fs} }
		o.Now = b.clk.now
		o.Registerer = b.reg
		o.Health = sandbox.HealthOptions{Node: b.node, AgentBrokenAfter: 20 * time.Second, OOMWindow: time.Minute, ExpiringSoon: time.Minute}
	})
	req := oneVM("debian")
	req.Owner = b.owner
	req.TTLSeconds = 600
	sb, err := b.e.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	b.sb, b.vmid = sb, sb.VMs[0].VMID
	b.node.set(b.vmid, sandbox.VMStats{CPUSeconds: 1.5, MemoryBytes: 100 << 20, MemoryPeakBytes: 200 << 20, NetBytesToGuest: 7})
	return b
}

// round advances the clock and runs one health round.
func (b *healthBed) round(d time.Duration) apitype.SandboxHealth {
	b.clk.add(d)
	b.e.CheckHealth(context.Background())
	h, _ := b.e.Health(b.sb.ID)
	return h
}

// TestHealthStates: each host-side signal turns the sandbox to the right
// state and reason, a broken VM refuses guest calls with BrokenError, and
// the VM comes back to ok when the signal clears.
func TestHealthStates(t *testing.T) {
	for _, tc := range []struct {
		name   string
		breakf func(b *healthBed)
		wait   time.Duration // clock advance after the break
		state  string
		reason string
		fix    func(b *healthBed)
	}{
		{"agent silent briefly", func(b *healthBed) { b.g.SetPingFails(b.vmid, true) }, 5 * time.Second, apitype.HealthDegraded, apitype.ReasonAgentSlow,
			func(b *healthBed) { b.g.SetPingFails(b.vmid, false) }},
		{"agent silent past the threshold", func(b *healthBed) { b.g.SetPingFails(b.vmid, true) }, 25 * time.Second, apitype.HealthBroken, apitype.ReasonAgentUnresponsive,
			func(b *healthBed) { b.g.SetPingFails(b.vmid, false) }},
		{"vm stopped behind the daemon's back", func(b *healthBed) { b.px.SetVMState(b.vmid, "stopped", "") }, time.Second, apitype.HealthBroken, apitype.ReasonVMStopped,
			func(b *healthBed) { b.px.SetVMState(b.vmid, "running", "") }},
		{"guest panicked (pvepanic)", func(b *healthBed) { b.px.SetVMState(b.vmid, "running", "guest-panicked") }, time.Second, apitype.HealthBroken, apitype.ReasonGuestPanicked,
			func(b *healthBed) { b.px.SetVMState(b.vmid, "running", "") }},
		{"qemu internal error", func(b *healthBed) { b.px.SetVMState(b.vmid, "running", "internal-error") }, time.Second, apitype.HealthBroken, apitype.ReasonInternalError,
			func(b *healthBed) { b.px.SetVMState(b.vmid, "running", "") }},
		{"paused", func(b *healthBed) { b.px.SetVMState(b.vmid, "running", "paused") }, time.Second, apitype.HealthDegraded, apitype.ReasonVMPaused,
			func(b *healthBed) { b.px.SetVMState(b.vmid, "running", "") }},
		{"oom kill in the cgroup", func(b *healthBed) { b.node.set(b.vmid, sandbox.VMStats{OOMKills: 2}) }, time.Second, apitype.HealthDegraded, apitype.ReasonOOMKill,
			func(b *healthBed) { b.clk.add(2 * time.Minute) }},
		{"guest disk full (guest-reported)", func(b *healthBed) { b.fs.mu.Lock(); b.fs.used = 99; b.fs.mu.Unlock() }, time.Second, apitype.HealthDegraded, apitype.ReasonGuestDiskFull,
			func(b *healthBed) { b.fs.mu.Lock(); b.fs.used = 10; b.fs.mu.Unlock() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newHealthBed(t)
			if h := b.round(time.Second); h.State != apitype.HealthOK || h.Reason != "" {
				t.Fatalf("healthy sandbox: %+v", h)
			}
			last := b.e.LastEventID()
			tc.breakf(b)
			b.round(time.Second)
			h := b.round(tc.wait)
			if h.State != tc.state || h.Reason != tc.reason || !strings.Contains(h.Detail, "vm0") {
				t.Fatalf("after the break: %s/%s (%s), want %s/%s", h.State, h.Reason, h.Detail, tc.state, tc.reason)
			}
			if h.VMs[0].State != tc.state || h.Since.After(b.clk.now()) {
				t.Errorf("vm health %+v", h.VMs[0])
			}
			sb, _ := b.e.Get(b.sb.ID)
			if sb.Health == nil || sb.Health.State != tc.state {
				t.Errorf("Get's health %+v", sb.Health)
			}
			var be *sandbox.BrokenError
			err := b.e.Broken(b.sb.ID, "vm0")
			if got := errors.As(err, &be); got != (tc.state == apitype.HealthBroken) || got && be.Reason != tc.reason {
				t.Errorf("Broken: %v, want broken=%v", err, tc.state == apitype.HealthBroken)
			}
			evs := b.e.EventsSince(last, sandbox.NewEventFilter("", nil, []string{apitype.EventHealth})).Events
			if len(evs) == 0 || evs[len(evs)-1].Health.Reason != tc.reason || evs[len(evs)-1].Owner != b.owner {
				t.Errorf("health events %+v", evs)
			}
			tc.fix(b)
			b.round(time.Second)
			if h := b.round(time.Second); h.State != apitype.HealthOK {
				t.Errorf("after the fix: %+v", h)
			}
			if err := b.e.Broken(b.sb.ID, "vm0"); err != nil {
				t.Errorf("Broken after the fix: %v", err)
			}
		})
	}
}

// TestHealthSignals: the host signals and the guest's report are in the
// health object, the guest's marked as reported by it.
func TestHealthSignals(t *testing.T) {
	b := newHealthBed(t)
	h := b.round(time.Second)
	v := h.VMs[0]
	if v.Host.Status != "running" || v.Host.QMPStatus != "running" || !v.Host.AgentOK || v.Host.CPUSeconds != 1.5 ||
		v.Host.MemoryBytes != 100<<20 || v.Host.MemoryPeakBytes != 200<<20 || v.Host.NetBytesToGuest != 7 || v.Host.LastAgentAnswer == nil {
		t.Errorf("host signals %+v", v.Host)
	}
	if v.GuestReported == nil || len(v.GuestReported.Filesystems) != 1 || v.GuestReported.Filesystems[0].UsedBytes != 10 {
		t.Errorf("guest report %+v", v.GuestReported)
	}
}

// TestHealthEvents: a sandbox's life is on the stream in order (created,
// ready, expiring-soon, expired, deleted), filters keep an owner's and a
// type's events, and a resume from before the buffer reports the loss.
func TestHealthEvents(t *testing.T) {
	b := newHealthBed(t)
	b.round(time.Second)
	b.clk.add(9*time.Minute + 30*time.Second)
	b.round(0)
	b.round(time.Second) // warned once per expiry
	b.clk.add(time.Minute)
	if n := b.e.Reap(context.Background()); n != 1 {
		t.Fatalf("reaped %d", n)
	}
	var types []string
	for _, e := range b.e.EventsSince(0, sandbox.EventFilter{}).Events {
		if e.Sandbox != b.sb.ID || e.Owner != b.owner || e.ID == 0 {
			t.Errorf("event %+v", e)
		}
		types = append(types, e.Type)
	}
	want := []string{apitype.EventCreated, apitype.EventReady, apitype.EventExpiringSoon, apitype.EventExpired, apitype.EventDeleted}
	if strings.Join(types, ",") != strings.Join(want, ",") {
		t.Errorf("events %v, want %v", types, want)
	}
	if evs := b.e.EventsSince(0, sandbox.NewEventFilter("bob", nil, nil)).Events; len(evs) != 0 {
		t.Errorf("another owner sees %+v", evs)
	}
	if evs := b.e.EventsSince(0, sandbox.NewEventFilter("", nil, []string{apitype.EventDeleted})).Events; len(evs) != 1 {
		t.Errorf("type filter %+v", evs)
	}
	if got := b.e.EventsSince(b.e.LastEventID()+5, sandbox.EventFilter{}); !got.Lost || len(got.Events) != len(want) {
		t.Errorf("resume from after a restart: lost=%v %d events", got.Lost, len(got.Events))
	}
	if got := b.e.EventsSince(b.e.LastEventID(), sandbox.EventFilter{}); got.Lost || len(got.Events) != 0 {
		t.Errorf("resume from the newest: %+v", got)
	}
}

// TestEventBufferBounded: the buffer keeps the newest events only, and a
// resume from before them reports the loss.
func TestEventBufferBounded(t *testing.T) {
	e := newEngine(t, func(o *sandbox.Options) { o.Health.EventBuffer = 3 })
	for range 3 {
		sb, err := e.Create(context.Background(), oneVM("debian"))
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Delete(context.Background(), sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	got := e.EventsSince(1, sandbox.EventFilter{})
	if !got.Lost || len(got.Events) != 3 || got.Events[0].ID != e.LastEventID()-2 {
		t.Errorf("lost=%v events=%+v", got.Lost, got.Events)
	}
}

// TestHealthSeries: the per-sandbox series exist while the sandbox does,
// labelled sandbox, vm, vmid and owner, and are gone after its delete.
func TestHealthSeries(t *testing.T) {
	b := newHealthBed(t)
	b.round(time.Second)
	names := []string{"pve_inspect_sandbox_vm_cpu_seconds_total", "pve_inspect_sandbox_vm_memory_bytes", "pve_inspect_sandbox_vm_network_bytes_total", "pve_inspect_sandbox_vm_health"}
	if n, err := testutil.GatherAndCount(b.reg, names...); err != nil || n != 1+1+2+3 {
		t.Fatalf("series while ready: %d %v", n, err)
	}
	mfs, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "pve_inspect_sandbox_vm_health" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["sandbox"] == b.sb.ID && l["vm"] == "vm0" && l["owner"] == b.owner && l["state"] == "ok" && m.GetGauge().GetValue() == 1 {
				found = true
			}
		}
	}
	if !found {
		t.Error("no ok health series labelled sandbox, vm, owner")
	}
	if err := b.e.Delete(context.Background(), b.sb.ID); err != nil {
		t.Fatal(err)
	}
	b.round(time.Second)
	if n, err := testutil.GatherAndCount(b.reg, names...); err != nil || n != 0 {
		t.Errorf("series after delete: %d %v", n, err)
	}
}
