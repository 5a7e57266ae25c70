package e2e_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestBedSharedVNetGuarded: two sandboxes of different owners, each VM's
// only NIC on a vnet the operator made (SNAT on) and shares, on the bed.
// Seen from alice's VM with the guest's own TCP stack: before the host
// guard runs, bob's VM, the metadata service, and the node's control
// ports on the vnet's gateway and on the management address all answer
// (so no probe is blind); with the guard running and knowing the vnet's
// zone (as the daemon knows it from Proxmox's applied SDN config), bob's
// VM still answers (the vnet is one segment: what the operator opts into,
// README "Shared vnets"), and the metadata service and every control port
// are cut, as on every guest bridge the daemon did not create; the VM's
// port is pinned in the layer-2 table. The deletes leave the vnet.
func TestBedSharedVNetGuarded(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var gmu sync.Mutex
	var guard *firewall.Guard
	// the daemon's guard takes the union of the sandbox zones and
	// Proxmox's applied SDN config (firewall/sdnzones): the operator's
	// zone is added here by hand
	withOperator := func(z map[string][]string) map[string][]string {
		all := map[string][]string{"opzone": {"lab"}}
		for k, v := range z {
			all[k] = v
		}
		return all
	}
	e := newBedEnv(t, ctx, func(o *options) {
		o.SharedVNets = []string{"lab"}
		o.ZonesChanged = func(ctx context.Context, z map[string][]string) error {
			gmu.Lock()
			defer gmu.Unlock()
			if guard == nil {
				return nil
			}
			return guard.SetZones(ctx, withOperator(z))
		}
	})
	root := rootClient(t, e.emu, e.url, e.hc, "operator")
	operatorVNetSNAT(t, ctx, root, "opzone", "lab", "lab network", "10.88.0.0/24", true)
	shared := []apitype.VMRequest{{Template: "debian", NICs: []apitype.NIC{{VNet: "lab network"}}}}
	a, err := e.c.Create(ctx, apitype.CreateRequest{Owner: "alice", VMs: shared})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.c.Create(ctx, apitype.CreateRequest{Owner: "bob", VMs: shared})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.VMs[0].Addresses) != 1 || b.VMs[0].Addresses[0].Network != "vnet:lab" {
		t.Fatalf("bob's VM addresses %+v, want one on vnet:lab", b.VMs[0].Addresses)
	}
	bob := b.VMs[0].Addresses[0].IPv4
	targets := []struct{ name, addr string }{
		{"bob's VM", bob + "/22"},
		{"metadata", testvm.MetadataAddr + "/80"},
		{"gateway 8006", "10.88.0.1/8006"},
		{"gateway 22", "10.88.0.1/22"},
		{"management address 8006", testvm.NodeMgmtAddr + "/8006"},
	}
	// exit 124: timed out (dropped); anything else: answered (a refused
	// connection included: a route exists)
	probe := func(addr string) int {
		res, err := e.c.Exec(ctx, a.ID, "vm0", apitype.ExecRequest{Argv: []string{"timeout", "3", "bash", "-c", "exec 3<>/dev/tcp/" + addr}, TimeoutSeconds: 10})
		if err != nil {
			t.Fatal(err)
		}
		return res.ExitCode
	}
	for _, tg := range targets {
		if code := probe(tg.addr); code == 124 {
			t.Fatalf("without the guard %s (%s) did not answer: the probe is blind", tg.name, tg.addr)
		}
	}
	node, err := netns.GetFromName(e.bed.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	g := runBedGuard(t, ctx, e, node)
	gmu.Lock()
	guard = g
	gmu.Unlock()
	zones := map[string][]string{}
	for _, sb := range []apitype.Sandbox{a, b} {
		for _, n := range sb.Networks {
			zones[sb.Zone] = append(zones[sb.Zone], n.VNet)
		}
	}
	if err := g.SetZones(ctx, withOperator(zones)); err != nil {
		t.Fatal(err)
	}
	waitGuarded(t, g, a.VMs[0].VMID)
	waitGuarded(t, g, b.VMs[0].VMID)
	for _, tg := range targets {
		code := probe(tg.addr)
		if want := tg.name == "bob's VM"; (code != 124) != want {
			t.Errorf("with the guard, %s (%s): exit %d, want answered %v", tg.name, tg.addr, code, want)
		}
	}
	for _, id := range []string{a.ID, b.ID} {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Error(err)
		}
	}
	vnets, err := e.px.ListVNets(ctx)
	if err != nil || fmt.Sprint(vnets) != "[{lab opzone lab network}]" {
		t.Errorf("vnets after the deletes %+v %v, want the shared vnet alone", vnets, err)
	}
}
