package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// ctfRequest is a CTF's sandbox: a target VM without a guest agent (an
// e1000 NIC, as a VulnHub image wants) listed first, and an attacker
// with one.
func ctfRequest() apitype.CreateRequest {
	net := []string{"net0"}
	return apitype.CreateRequest{VMs: []apitype.VMRequest{
		{Name: "target", Template: "debian", Cores: 1, MemoryMiB: 512, Networks: net, Agent: new(bool), NICController: "e1000"},
		{Name: "attacker", Template: "debian", Cores: 1, MemoryMiB: 512, Networks: net},
	}, Networks: []apitype.NetworkRequest{{Name: "net0", CIDR: "auto"}}, Env: map[string]string{"API_KEY": "secret"}, TTLSeconds: 600, Owner: "alice"}
}

// agentlessBed is an engine on the fakes, whose Proxmox starts no agent
// for a VM configured without one (apitest: VMConfig.NoAgent).
type agentlessBed struct {
	e   *sandbox.Engine
	px  *apitest.Proxmox
	g   *apitest.Guests
	o   sandbox.Options
	clk *clock
	reg *prometheus.Registry
}

func newAgentlessBed(t *testing.T) *agentlessBed {
	t.Helper()
	b := &agentlessBed{g: apitest.NewGuests(), clk: &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}, reg: prometheus.NewRegistry()}
	b.px = apitest.NewProxmox(b.g, map[string]int{"debian": 9000})
	b.e = newEngine(t, func(o *sandbox.Options) {
		o.Proxmox, o.Guests = b.px, b.g.Dial
		o.AllowE1000 = true
		o.Now = b.clk.now
		o.Registerer = b.reg
		o.Health = sandbox.HealthOptions{Node: &nodeStats{st: map[int]sandbox.VMStats{}}, AgentBrokenAfter: 20 * time.Second}
		b.o = *o
	})
	return b
}

// newCTF is an agentlessBed with the sandbox of ctfRequest made.
func newCTF(t *testing.T) (*agentlessBed, apitype.Sandbox) {
	t.Helper()
	b := newAgentlessBed(t)
	sb, err := b.e.Create(context.Background(), ctfRequest())
	if err != nil {
		t.Fatal(err)
	}
	return b, sb
}

// TestAgentlessVMReady: a VM created with agent false, whose agent never
// answers (its clone has no agent device), is ready once it runs: the
// sandbox is ready, the VM is reported with agent false, its clone was
// configured without the agent and with the NIC model asked for; it is
// not named in its guest nor given env, while its sibling is, and knows
// it by name. Every call through the agent refuses it with a conflict
// naming the VM, and the member a call that names none runs in is the
// sibling.
func TestAgentlessVMReady(t *testing.T) {
	ctx := context.Background()
	b, sb := newCTF(t)
	if sb.State != apitype.StateReady || len(sb.VMs) != 2 {
		t.Fatalf("sandbox %+v, want a ready one of two VMs", sb)
	}
	target, attacker := sb.VMs[0], sb.VMs[1]
	if target.Agent == nil || *target.Agent || target.HasAgent() || attacker.Agent != nil || !attacker.HasAgent() {
		t.Errorf("agents: target %v, attacker %v; want false and omitted", target.Agent, attacker.Agent)
	}
	if target.NICController != "e1000" {
		t.Errorf("target's nic_controller %q", target.NICController)
	}
	tv, _ := b.px.VMByID(target.VMID)
	av, _ := b.px.VMByID(attacker.VMID)
	if !tv.Config.NoAgent || tv.Config.NICModel != "e1000" || av.Config.NoAgent || av.Config.NICModel != "" {
		t.Errorf("configured: target %+v, attacker %+v; want the target without agent, on e1000", tv.Config, av.Config)
	}
	if tv.Info.Status != "running" {
		t.Errorf("target is %s", tv.Info.Status)
	}
	if err := b.g.Dial(fmt.Sprintf("/run/qemu-server/%d.qga", target.VMID)).Ping(ctx); !errors.Is(err, sandbox.ErrGuestUnavailable) {
		t.Fatalf("the target's agent answers (%v): the test's premise is gone", err)
	}
	if h := b.g.Hostname(target.VMID); h != "" {
		t.Errorf("the target was named in its guest: %q", h)
	}
	if h := b.g.Hostname(attacker.VMID); h != "attacker" {
		t.Errorf("attacker's hostname %q", h)
	}
	if hosts, _ := b.g.File(attacker.VMID, "/etc/hosts"); !strings.Contains(string(hosts), "\ttarget\n") {
		t.Errorf("attacker's /etc/hosts does not name the target:\n%s", hosts)
	}
	if _, ok := b.g.File(target.VMID, apitype.GuestEnvPath); ok {
		t.Error("the target got the env file")
	}
	if env, ok := b.g.File(attacker.VMID, apitype.GuestEnvPath); !ok || !strings.Contains(string(env), "API_KEY=") {
		t.Errorf("attacker's env file %q, %v", env, ok)
	}

	for what, err := range map[string]error{"guest I/O": b.e.GuestIO(target), "containment check": sandbox.CheckIO(target)} {
		if !errors.Is(err, sandbox.ErrConflict) || !strings.Contains(err.Error(), "vm target has no guest agent") {
			t.Errorf("%s on the target: %v, want a conflict naming it", what, err)
		}
	}
	if err := b.e.GuestIO(attacker); err != nil {
		t.Errorf("guest I/O on the attacker: %v", err)
	}
	if got := b.e.FirstCheckVM(sb.ID); got != "attacker" {
		t.Errorf("first member with an agent %q, want attacker", got)
	}
}

// TestAgentlessVMRollback: a rollback of a VM without an agent (the
// fake's rollback leaves it stopped) starts it and returns once Proxmox
// reports it running, with no agent wait.
func TestAgentlessVMRollback(t *testing.T) {
	ctx := context.Background()
	b, sb := newCTF(t)
	id := sb.VMs[0].VMID
	if err := b.e.Snapshot(ctx, id, "clean"); err != nil {
		t.Fatal(err)
	}
	if err := b.e.Rollback(ctx, id, "clean"); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	if v, _ := b.px.VMByID(id); v.Info.Status != "running" {
		t.Errorf("after the rollback the target is %s", v.Info.Status)
	}
}

// TestAgentlessVMHealth: the health monitor does not ping a VM without
// an agent and never judges it by its agent: past the broken threshold
// it is ok, reported no_agent with agent_ok false and no last answer,
// the metrics carry no agent series for it (its sibling's agent_up is 1),
// and the reaper leaves the sandbox alone. Host-side signals still
// count: stopped behind the daemon's back, it is broken (vm-stopped).
func TestAgentlessVMHealth(t *testing.T) {
	ctx := context.Background()
	b, sb := newCTF(t)
	for range 3 {
		b.clk.add(15 * time.Second)
		b.e.CheckHealth(ctx)
	}
	h, ok := b.e.Health(sb.ID)
	if !ok || h.State != apitype.HealthOK {
		t.Fatalf("health %+v, want ok", h)
	}
	for _, v := range h.VMs {
		switch v.Name {
		case "target":
			if v.State != apitype.HealthOK || !v.Host.NoAgent || v.Host.AgentOK || v.Host.LastAgentAnswer != nil || v.Host.SecondsSinceAgentAnswer != 0 {
				t.Errorf("target's health %+v, want ok without agent signals", v)
			}
		case "attacker":
			if v.State != apitype.HealthOK || v.Host.NoAgent || !v.Host.AgentOK {
				t.Errorf("attacker's health %+v", v)
			}
		}
	}
	if err := b.e.Broken(sb.ID, "target"); err != nil {
		t.Errorf("the target counts as broken: %v", err)
	}
	if n := b.e.Reap(ctx); n != 0 {
		t.Errorf("the reaper deleted %d sandboxes", n)
	}
	up := `
# HELP pve_inspect_sandbox_vm_agent_up 1 when the last guest agent ping was answered.
# TYPE pve_inspect_sandbox_vm_agent_up gauge
pve_inspect_sandbox_vm_agent_up{owner="alice",sandbox="` + sb.ID + `",vm="attacker",vmid="` + strconv.Itoa(sb.VMs[1].VMID) + `"} 1
`
	if err := testutil.GatherAndCompare(b.reg, strings.NewReader(up), "pve_inspect_sandbox_vm_agent_up"); err != nil {
		t.Error(err)
	}
	for _, name := range []string{"pve_inspect_sandbox_vm_agent_silence_seconds", "pve_inspect_sandbox_vm_agent_rtt_seconds"} {
		if n, err := testutil.GatherAndCount(b.reg, name); err != nil || n != 1 {
			t.Errorf("%s: %d series (%v), want the attacker's only", name, n, err)
		}
	}

	b.px.SetVMState(sb.VMs[0].VMID, "stopped", "")
	b.clk.add(5 * time.Second)
	b.e.CheckHealth(ctx)
	h, _ = b.e.Health(sb.ID)
	if h.State != apitype.HealthBroken || h.Reason != apitype.ReasonVMStopped || !strings.Contains(h.Detail, "vm target") {
		t.Errorf("health after the target stopped: %+v, want broken (vm-stopped)", h)
	}
}

// neverRunning is a Proxmox whose VMs configured without an agent never
// run their guest: Proxmox's status running, QMP status prelaunch (QEMU
// started with -S, as a template with `freeze: 1` starts; a VM paused on
// an I/O error at boot is running too). Every read says so (VM reads
// the live status: the teardown stops and destroys the VM as it is).
type neverRunning struct{ *apitest.Proxmox }

func (p neverRunning) StartVM(ctx context.Context, id int) error {
	if err := p.Proxmox.StartVM(ctx, id); err != nil {
		return err
	}
	if v, ok := p.VMByID(id); ok && v.Config.NoAgent {
		p.SetVMState(id, "running", "prelaunch")
	}
	return nil
}

// TestAgentlessVMNeverRunning: the wait for a VM without an agent is
// bounded like the agent's: a VM whose guest never runs (running for
// Proxmox, QMP status prelaunch) is not ready; it fails the create
// (within AgentTimeout) with the VM, what was waited for and the QMP
// status named, and the create tears everything down.
func TestAgentlessVMNeverRunning(t *testing.T) {
	ctx := context.Background()
	g := apitest.NewGuests()
	px := apitest.NewProxmox(g, map[string]int{"debian": 9000})
	e := newEngine(t, func(o *sandbox.Options) {
		o.Proxmox = neverRunning{px}
		o.Guests = g.Dial
		o.AgentTimeout = 300 * time.Millisecond
		o.AllowE1000 = true
	})
	sb, err := e.Create(ctx, ctfRequest())
	if err == nil {
		t.Fatalf("created %s (state %s) with its target never running its guest: want the create refused", sb.ID, sb.State)
	}
	if !strings.Contains(err.Error(), "vm target") || !strings.Contains(err.Error(), "wait for Proxmox to report it running") || !strings.Contains(err.Error(), "prelaunch") {
		t.Fatalf("create: %v, want the target's wait and its QMP status named", err)
	}
	if ids := px.VMIDs(); len(ids) != 0 { // VMIDs lists no template
		t.Errorf("VMs left after the failed create: %v", ids)
	}
	if l := e.List(); len(l) != 0 {
		t.Errorf("sandboxes left after the failed create: %+v", l)
	}
}

// TestAgentlessVMRestart: a restarted daemon reads the VM's agent false
// from the state file: it still refuses the VM's guest I/O and does not
// judge it by its agent.
func TestAgentlessVMRestart(t *testing.T) {
	ctx := context.Background()
	b, sb := newCTF(t)
	o := b.o
	o.Registerer = nil
	e2, err := sandbox.New(o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e2.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	got, ok := e2.Get(sb.ID)
	if !ok || got.State != apitype.StateReady {
		t.Fatalf("after the restart: %+v, %v", got, ok)
	}
	if got.VMs[0].HasAgent() || !got.VMs[1].HasAgent() || got.VMs[0].NICController != "e1000" {
		t.Errorf("after the restart: VMs %+v, want the target without agent, on e1000", got.VMs)
	}
	if err := e2.GuestIO(got.VMs[0]); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("guest I/O on the target after the restart: %v", err)
	}
	for range 3 {
		b.clk.add(15 * time.Second)
		e2.CheckHealth(ctx)
	}
	if h, _ := e2.Health(sb.ID); h.State != apitype.HealthOK {
		t.Errorf("health after the restart: %+v", h)
	}
}

// TestAgentlessE1000NeedsTheNode: nic_controller e1000 is refused where
// [api] allow_e1000 is off, naming the field and the setting.
func TestAgentlessE1000NeedsTheNode(t *testing.T) {
	e := newEngine(t, nil)
	_, err := e.Create(context.Background(), ctfRequest())
	var ie *sandbox.InvalidError
	if !errors.As(err, &ie) || ie.Field != "vms[0].nic_controller" || !strings.Contains(err.Error(), "allow_e1000 = true") {
		t.Fatalf("create: %v, want vms[0].nic_controller refused", err)
	}
}
