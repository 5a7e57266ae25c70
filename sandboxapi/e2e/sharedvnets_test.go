package e2e_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// operatorVNet makes, as the node's operator (a root token), a simple zone
// with DHCP and the pve IPAM, a vnet in it with alias and one subnet with a
// DHCP range, applied: a vnet the daemon did not create.
func operatorVNet(t *testing.T, ctx context.Context, root *pveapi.Client, zone, vnet, alias, cidr string) {
	t.Helper()
	operatorVNetSNAT(t, ctx, root, zone, vnet, alias, cidr, false)
}

// operatorVNetSNAT is operatorVNet with the subnet's SNAT as snat.
func operatorVNetSNAT(t *testing.T, ctx context.Context, root *pveapi.Client, zone, vnet, alias, cidr string, snat bool) {
	t.Helper()
	if err := root.CreateZone(ctx, sandbox.ZoneSpec{ID: zone}); err != nil {
		t.Fatal(err)
	}
	if err := root.CreateVNet(ctx, sandbox.VNetSpec{ID: vnet, Zone: zone, Alias: alias}); err != nil {
		t.Fatal(err)
	}
	if cidr != "" {
		p := netip.MustParsePrefix(cidr)
		gw := p.Addr().Next()
		lo, hi := gw, gw
		for range 9 {
			lo = lo.Next() // .10
		}
		for a := p.Addr(); p.Contains(a.Next()); a = a.Next() {
			hi = a // the last address but one: below the broadcast
		}
		if err := root.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: vnet, CIDR: cidr, Gateway: gw.String(), SNAT: snat,
			DHCPRanges: []apitype.DHCPRange{{Start: lo.String(), End: hi.String()}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := root.ApplySDN(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestEmulatorSharedVNet: a vnet the operator made and shares ([api]
// shared_vnets) takes NICs of sandboxes of two owners, named by its
// Proxmox alias and by its id: each VM's NIC is on the vnet's bridge, the
// answer gives its IPAM address there (networks entry vnet:<id>), and the
// vnet's zone's IPAM holds an entry of each NIC's MAC. A vnet not shared,
// and an egress policy beside a shared NIC, are refused naming the field
// (the refusal lists what the node shares); the validate endpoint says the
// same. Deleting the sandboxes removes their VMs and so their IPAM entries
// on the vnet (qemu-server's destroy), their own zones, and never the
// shared vnet, its zone or its subnet.
func TestEmulatorSharedVNet(t *testing.T) {
	e := newEmuEnvTB(t, func(o *options) { o.SharedVNets = []string{"lab"} })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root := rootClient(t, e.emu, e.url, e.hc, "operator")
	operatorVNet(t, ctx, root, "opzone", "lab", "lab network", "10.88.0.0/24")

	// refusals first: nothing is created
	for _, tc := range []struct {
		name  string
		req   apitype.CreateRequest
		field string
	}{
		{"a vnet not shared", apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", NICs: []apitype.NIC{{VNet: "other"}}}}}, "vms[0].nics[0].vnet"},
		{"an egress policy beside a shared NIC", apitype.CreateRequest{Egress: &apitype.EgressPolicy{Mode: "none"},
			VMs: []apitype.VMRequest{{Template: "debian", NICs: []apitype.NIC{{VNet: "lab"}}}}}, "egress"},
		{"a fixed MAC on a shared vnet", apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", NICs: []apitype.NIC{{VNet: "lab", MAC: "02:00:00:00:00:01"}}}}}, "vms[0].nics[0].mac"},
	} {
		_, err := e.c.Create(ctx, tc.req)
		var p *apitype.Problem
		if !errors.As(err, &p) || p.Type != apitype.ProblemInvalidRequest || p.Field != tc.field {
			t.Fatalf("%s: %v, want invalid-request of field %s", tc.name, err, tc.field)
		}
		if tc.field == "vms[0].nics[0].vnet" && !strings.Contains(p.Detail, `lab (alias "lab network")`) {
			t.Errorf("%s: %q does not list the shared vnet", tc.name, p.Detail)
		}
		rep, err := e.c.Validate(ctx, tc.req)
		if tc.field == "vms[0].nics[0].mac" {
			continue // the API's own rules: the create's refusal, not a report
		}
		if err != nil || rep.Valid || !slices.ContainsFunc(rep.Problems, func(q apitype.Problem) bool { return q.Field == tc.field }) {
			t.Errorf("%s: validate %+v %v, want a problem of field %s", tc.name, rep, err, tc.field)
		}
	}

	a, err := e.c.Create(ctx, apitype.CreateRequest{Owner: "alice", VMs: []apitype.VMRequest{
		{Name: "web", Template: "debian", NICs: []apitype.NIC{{Network: "net0"}, {VNet: "lab network"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.c.Create(ctx, apitype.CreateRequest{Owner: "bob", VMs: []apitype.VMRequest{
		{Name: "db", Template: "debian", NICs: []apitype.NIC{{VNet: "lab"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	lab := netip.MustParsePrefix("10.88.0.0/24")
	var macs []string
	for _, tc := range []struct {
		sb   apitype.Sandbox
		nets []string
	}{{a, []string{"net0", "vnet:lab"}}, {b, []string{"vnet:lab"}}} {
		vm := tc.sb.VMs[0]
		if !slices.Equal(vm.Networks, tc.nets) || vm.NICs[len(vm.NICs)-1].VNet != "lab" {
			t.Fatalf("%s: networks %v NICs %+v, want %v and the vnet's id", tc.sb.Owner, vm.Networks, vm.NICs, tc.nets)
		}
		k := slices.IndexFunc(vm.Addresses, func(x apitype.VMAddress) bool { return x.Network == "vnet:lab" })
		if k < 0 || !lab.Contains(netip.MustParseAddr(vm.Addresses[k].IPv4)) {
			t.Fatalf("%s: addresses %+v, want one of %s on vnet:lab", tc.sb.Owner, vm.Addresses, lab)
		}
		cfg, err := root.VMConfig(ctx, vm.VMID)
		if err != nil {
			t.Fatal(err)
		}
		nic := cfg["net"+string(rune('0'+len(tc.nets)-1))]
		if !strings.Contains(nic, "bridge=lab") {
			t.Fatalf("%s: NIC %q is not on the shared vnet", tc.sb.Owner, nic)
		}
		mac, _, _ := strings.Cut(strings.TrimPrefix(nic, "virtio="), ",")
		macs = append(macs, mac)
		if !slices.Contains(e.emu.IPAMEntries("opzone"), "10.88.0.0/24 "+vm.Addresses[k].IPv4+" "+mac) {
			t.Errorf("%s: no IPAM entry of %s for %s on the shared vnet: %q", tc.sb.Owner, vm.Addresses[k].IPv4, mac, e.emu.IPAMEntries("opzone"))
		}
	}
	// (a later egress policy is refused too: sandbox
	// TestSharedVNetTakesNoEgress, on a node with egress policies)

	for _, sb := range []apitype.Sandbox{a, b} {
		if err := e.c.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	vnets, err := e.px.ListVNets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(vnets, []sandbox.VNetInfo{{ID: "lab", Zone: "opzone", Alias: "lab network"}}) {
		t.Errorf("vnets after the deletes %+v, want the shared vnet alone", vnets)
	}
	if got := e.emu.IPAMEntries("opzone"); !slices.Equal(got, []string{"10.88.0.0/24 10.88.0.1 gateway"}) {
		t.Errorf("shared vnet's IPAM after the deletes %q, want its gateway alone (macs %v)", got, macs)
	}
	if cidrs, err := e.px.VNetSubnets(ctx, "lab"); err != nil || !slices.Equal(cidrs, []string{"10.88.0.0/24"}) {
		t.Errorf("shared vnet's subnets %v %v", cidrs, err)
	}
	for _, sb := range []apitype.Sandbox{a, b} {
		if got := e.emu.IPAMEntries(sb.ID); len(got) != 0 {
			t.Errorf("sandbox %s's zone IPAM left: %q", sb.ID, got)
		}
	}
}

// TestEmulatorSharedVNetsChecked: the daemon's start check of [api]
// shared_vnets (Engine.CheckSharedVNets, which keeps the API unavailable
// while it fails) refuses, naming the vnet, one Proxmox does not have, one
// in a sandbox's zone, one whose alias carries a sandbox's tags, one
// without a subnet, and one that is a management or trusted interface;
// the operator's vnet with a subnet passes.
func TestEmulatorSharedVNetsChecked(t *testing.T) {
	e := newEmuEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root := rootClient(t, e.emu, e.url, e.hc, "operator")
	operatorVNet(t, ctx, root, "opzone", "lab", "", "10.88.0.0/24")
	operatorVNet(t, ctx, root, "sbabcdef", "vabcdef0", "", "10.89.0.0/24")
	operatorVNet(t, ctx, root, "tagzone", "tagged", "pvei-n-pve pvei-s-sbzzzzzz", "10.90.0.0/24")
	operatorVNet(t, ctx, root, "barezone", "bare", "", "")
	operatorVNet(t, ctx, root, "upzone", "uplink", "", "10.91.0.0/24")
	for _, tc := range []struct {
		vnet, want string // want "" passes
	}{
		{"lab", ""},
		{"nosuch", "not a vnet of Proxmox's SDN"},
		{"vabcdef0", "a sandbox's"},
		{"tagged", "ownership tags"},
		{"bare", "no IPv4 subnet"},
		{"uplink", "management or trusted"},
	} {
		eng, err := sandbox.New(sandbox.Options{Node: "pve", Proxmox: e.px, Guests: socketGuests, StateDir: t.TempDir(),
			SharedVNets: []string{tc.vnet}, HostInterfaces: func() []string { return []string{"vmbr0", "uplink"} },
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		err = eng.CheckSharedVNets(ctx)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.vnet, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.vnet)):
			t.Errorf("%s: %v, want a refusal naming it: %s", tc.vnet, err, tc.want)
		}
	}
}
