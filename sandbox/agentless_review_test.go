package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// stoppedAfterStart is a Proxmox whose VMs configured without an agent
// are stopped whenever they are read after their start (a guest that
// powers itself off at boot, a QEMU that ended): a started VM that is
// stopped never runs again by itself. After reads reads of such a VM it
// cancels cancel (the create's context), so a wait that does not see
// the stop ends there.
type stoppedAfterStart struct {
	*apitest.Proxmox
	mu     sync.Mutex
	reads  int
	cancel context.CancelFunc
}

func (p *stoppedAfterStart) read(id int) bool {
	v, ok := p.VMByID(id)
	if !ok || !v.Config.NoAgent || v.Info.Status != "running" {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reads++; p.reads >= 5 {
		p.cancel()
	}
	return true
}

func (p *stoppedAfterStart) VM(ctx context.Context, id int) (sandbox.VMInfo, error) {
	info, err := p.Proxmox.VM(ctx, id)
	if err == nil && p.read(id) {
		info.Status = "stopped"
	}
	return info, err
}

func (p *stoppedAfterStart) VMStatus(ctx context.Context, id int) (sandbox.VMRunState, error) {
	st, err := p.Proxmox.VMStatus(ctx, id)
	if err == nil && p.read(id) {
		st = sandbox.VMRunState{Status: "stopped", QMPStatus: "stopped"}
	}
	return st, err
}

// TestAgentlessVMStoppedAfterStartFails: a VM without an agent that
// Proxmox reports stopped after its start task ended OK has stopped (its
// guest powered itself off, or QEMU ended) and will not run by itself:
// the create fails at once naming that, instead of polling a stopped VM
// for the whole AgentTimeout (5 minutes by default) while holding the
// owner's caps.
func TestAgentlessVMStoppedAfterStartFails(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := apitest.NewGuests()
	px := &stoppedAfterStart{Proxmox: apitest.NewProxmox(g, map[string]int{"debian": 9000}), cancel: cancel}
	e := newEngine(t, func(o *sandbox.Options) {
		o.Proxmox = px
		o.Guests = g.Dial
		o.AgentTimeout = time.Hour
		o.AllowE1000 = true
	})
	_, err := e.Create(ctx, ctfRequest())
	if err == nil || !strings.Contains(err.Error(), "vm target") || !strings.Contains(err.Error(), "stopped after its start") {
		t.Fatalf("create: %v, want the target's stop named at once (not a wait cut short)", err)
	}
	// the guest is gone (502, as an agent VM's that never answers), not
	// the daemon's fault (500)
	if !errors.Is(err, sandbox.ErrGuestUnavailable) {
		t.Errorf("create: %v, want it to wrap ErrGuestUnavailable", err)
	}
}

// TestCheckVMSkipsWindows: the member a containment check that names
// none runs from is the first one the check can run in (CheckIO): past a
// VM without an agent and past a Windows VM (whose check is refused: its
// probes are Linux programs), the Linux VM with an agent.
func TestCheckVMSkipsWindows(t *testing.T) {
	e := newEngine(t, func(o *sandbox.Options) { o.AllowWindows = true })
	net := []string{"net0"}
	sb, err := e.Create(context.Background(), apitype.CreateRequest{VMs: []apitype.VMRequest{
		{Name: "target", Template: "debian", Cores: 1, MemoryMiB: 512, Networks: net, Agent: new(bool)},
		{Name: "win", Template: "debian", Cores: 1, MemoryMiB: 512, Networks: net, OSType: "win11"},
		{Name: "lin", Template: "debian", Cores: 1, MemoryMiB: 512, Networks: net},
	}, Networks: []apitype.NetworkRequest{{Name: "net0", CIDR: "auto"}}, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.FirstCheckVM(sb.ID); got != "lin" {
		t.Errorf("the check's default member %q, want lin (the first the check can run in)", got)
	}
	for _, v := range sb.VMs {
		if err := sandbox.CheckIO(v); (err == nil) != (v.Name == "lin") {
			t.Errorf("CheckIO(%s): %v", v.Name, err)
		}
	}
}
