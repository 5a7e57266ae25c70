package templatebuild_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/templatebuild"
)

// TestBuildNetworkOnEmulator: with no --bridge the build makes its SDN
// network through Proxmox's API (a simple zone, a vnet, a subnet with
// SNAT and a DHCP range, applied: the emulator checks each as
// pve-network does), creates the VM on it, and a second build reuses
// the network.
func TestBuildNetworkOnEmulator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, r, _ := cloudRawNode(t)
	for _, name := range []string{"net1", "net2"} {
		var out bytes.Buffer
		b, err := templatebuild.New(e.px, e.agent, templatebuild.NodeHost{HTTPClient: e.images.Client(), StateDir: e.ledger},
			templatebuild.Options{Name: name, Recipe: r, Storage: "local-lvm", ImageStorage: "local", SnippetStorage: "local",
				AgentWait: 30 * time.Second, AgentPoll: 20 * time.Millisecond, Progress: &out, Protected: []string{"vmbr0"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Run(ctx); err != nil {
			t.Fatalf("build %s: %v\n%s", name, err, out.String())
		}
		if name == "net2" && !strings.Contains(out.String(), "is on the node: reused") {
			t.Errorf("second build did not reuse the network:\n%s", out.String())
		}
	}
	vnets, err := e.px.ListVNets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(vnets, func(v sandbox.VNetInfo) bool {
		return v.ID == templatebuild.BuildVNet && v.Zone == templatebuild.BuildZone
	}) {
		t.Errorf("vnets %+v: want %s in %s", vnets, templatebuild.BuildVNet, templatebuild.BuildZone)
	}
	if cidrs, err := e.px.VNetSubnets(ctx, templatebuild.BuildVNet); err != nil || !slices.Equal(cidrs, []string{templatebuild.DefaultBuildCIDR}) {
		t.Errorf("subnets %v %v", cidrs, err)
	}
	var creates []string
	for _, rq := range e.s.Requests() {
		if rq.Method == "POST" && rq.Path == "/nodes/pve/qemu" && rq.Status == 200 {
			net0, _ := rq.Params["net0"].(string)
			creates = append(creates, net0)
		}
	}
	if len(creates) != 2 || creates[0] != "virtio,bridge="+templatebuild.BuildVNet || creates[1] != creates[0] {
		t.Errorf("creates' net0 %q, want both on %s", creates, templatebuild.BuildVNet)
	}
}
