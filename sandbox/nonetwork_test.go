package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// portCounts is a NodeStats that records how many taps (veths) each
// member's read asked for, and reports every member's counters found.
type portCounts struct {
	mu    sync.Mutex
	ports map[int]int
}

func (p *portCounts) VMStats(vmid, nics int) sandbox.VMStats { return p.read(vmid, nics) }
func (p *portCounts) CTStats(vmid, nics int) sandbox.VMStats { return p.read(vmid, nics) }

func (p *portCounts) read(vmid, nics int) sandbox.VMStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ports[vmid] = nics
	return sandbox.VMStats{CPUSeconds: 1, MemoryBytes: 1 << 20}
}

func (p *portCounts) of(vmid int) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.ports[vmid]
	return n, ok
}

// noNetworkRequest is a sandbox of a VM without any NIC and a container
// without any, listed first, beside a VM on the sandbox's network.
func noNetworkRequest() apitype.CreateRequest {
	return apitype.CreateRequest{VMs: []apitype.VMRequest{
		{Name: "vault", Template: "debian", Cores: 1, MemoryMiB: 512, NoNetwork: true, Networks: []string{}},
		{Name: "cell", Kind: apitype.KindLXC, Template: "ct-debian", Cores: 1, MemoryMiB: 256, NoNetwork: true, Networks: []string{}},
		{Name: "box", Template: "debian", Cores: 1, MemoryMiB: 512, Networks: []string{"net0"}},
	}, Networks: []apitype.NetworkRequest{{Name: "net0", CIDR: "auto"}}, TTLSeconds: 600, Owner: "alice", Env: map[string]string{"API_KEY": "k"}}
}

// TestNoNetworkMembers: a VM and a container created with no_network are
// configured with no bridge (pveapi deletes every NIC of the template),
// answered with no_network and an empty networks list and no address,
// started and waited for as any member (their guests are named, and get
// env), while their sibling on the network is as usual. A member without
// NICs names itself only in its /etc/hosts, and its sibling's does not
// name it (it has no address to reach). Its health reads no tap, and is
// ok; the containment check is refused from it, the check of no member
// runs from the sibling; the delete removes everything; a restarted
// engine keeps the flag.
func TestNoNetworkMembers(t *testing.T) {
	ctx := context.Background()
	b := newCTBench(t, ctConf)
	ports := &portCounts{ports: map[int]int{}}
	b.o.Health = sandbox.HealthOptions{Node: ports, AgentBrokenAfter: 20 * time.Second}
	e := b.engine(t)
	sb, err := e.Create(ctx, noNetworkRequest())
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != apitype.StateReady || len(sb.VMs) != 3 {
		t.Fatalf("sandbox %+v, want a ready one of three members", sb)
	}
	vault, cell, box := sb.VMs[0], sb.VMs[1], sb.VMs[2]
	for _, v := range []apitype.VM{vault, cell} {
		if !v.NoNetwork || v.Networks == nil || len(v.Networks) != 0 || len(v.Addresses) != 0 || len(v.NICs) != 0 {
			t.Errorf("%s: no_network %v networks %#v addresses %v nics %v, want no NIC and no address", v.Name, v.NoNetwork, v.Networks, v.Addresses, v.NICs)
		}
	}
	if box.NoNetwork || len(box.Networks) != 1 || len(box.Addresses) != 1 {
		t.Errorf("box: %+v, want on net0 with its address", box)
	}
	vv, _ := b.p.VMByID(vault.VMID)
	bv, _ := b.p.VMByID(box.VMID)
	if len(vv.Config.Bridges) != 0 || len(bv.Config.Bridges) != 1 || vv.Info.Status != "running" {
		t.Errorf("configured: vault's bridges %v (%s), box's %v; want none and one", vv.Config.Bridges, vv.Info.Status, bv.Config.Bridges)
	}
	if conf := b.cts.Configs[cell.VMID]; conf["net0"] != "" || conf["hostname"] == "" {
		t.Errorf("the container's config %v, want no net0", conf)
	}
	for _, v := range []apitype.VM{vault, box} {
		if h := b.g.Hostname(v.VMID); h != v.Name {
			t.Errorf("%s's hostname %q", v.Name, h)
		}
		if env, ok := b.g.File(v.VMID, apitype.GuestEnvPath); !ok || !strings.Contains(string(env), "API_KEY=") {
			t.Errorf("%s's env file %q, %v", v.Name, env, ok)
		}
	}
	hosts, _ := b.g.File(vault.VMID, "/etc/hosts")
	if !strings.Contains(string(hosts), "127.0.1.1\tvault\n") || strings.Contains(string(hosts), "\tbox\n") {
		t.Errorf("vault's /etc/hosts names more than itself:\n%s", hosts)
	}
	hosts, _ = b.g.File(box.VMID, "/etc/hosts")
	if !strings.Contains(string(hosts), "\tbox\n") || strings.Contains(string(hosts), "vault") || strings.Contains(string(hosts), "cell") {
		t.Errorf("box's /etc/hosts:\n%s\nwant itself and neither member without a NIC", hosts)
	}

	e.CheckHealth(ctx)
	h, ok := e.Health(sb.ID)
	if !ok || h.State != apitype.HealthOK {
		t.Fatalf("health %+v, want ok", h)
	}
	for _, v := range []apitype.VM{vault, cell, box} {
		want := 0
		if v.Name == "box" {
			want = 1
		}
		if n, ok := ports.of(v.VMID); !ok || n != want {
			t.Errorf("%s: its health read %d ports (read %v), want %d", v.Name, n, ok, want)
		}
	}

	for _, v := range []apitype.VM{vault, cell} {
		if err := sandbox.CheckIO(v); !errors.Is(err, sandbox.ErrConflict) || !strings.Contains(err.Error(), "vm "+v.Name+" has no network") {
			t.Errorf("check from %s: %v, want a conflict naming it", v.Name, err)
		}
		if err := e.GuestIO(v); err != nil {
			t.Errorf("guest I/O on %s refused: %v", v.Name, err)
		}
	}
	if got := e.FirstCheckVM(sb.ID); got != "box" {
		t.Errorf("the check of no member runs from %q, want box", got)
	}

	// a restarted engine reads the flag from the state file
	b.o.Health = sandbox.HealthOptions{}
	e2 := b.engine(t)
	got, ok := e2.Get(sb.ID)
	if !ok || !got.VMs[0].NoNetwork || !got.VMs[1].NoNetwork || got.VMs[2].NoNetwork || got.VMs[0].Networks == nil {
		t.Fatalf("after the restart: %+v, %v", got.VMs, ok)
	}
	if err := e2.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if ids := b.p.VMIDs(); len(ids) != 0 {
		t.Errorf("VMs left after the delete: %v", ids)
	}
	if _, err := b.cts.CT(ctx, cell.VMID); err == nil {
		t.Error("the container is left after the delete")
	}
}
