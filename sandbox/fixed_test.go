package sandbox_test

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// daemonMAC is a MAC the daemon picks: locally administered, unicast,
// upper case.
var daemonMAC = regexp.MustCompile(`^[0-9A-F][26AE](:[0-9A-F]{2}){5}$`)

// fixedEngine is an engine on the fakes with their Proxmox.
func fixedEngine(t *testing.T) (*sandbox.Engine, *apitest.Proxmox) {
	var px *apitest.Proxmox
	e := newEngine(t, func(o *sandbox.Options) { px = o.Proxmox.(*apitest.Proxmox) })
	return e, px
}

// TestFixedAddressOrder: a NIC's fixed address is reserved for its MAC
// before the NIC is configured with that MAC, and the DHCP-range address
// the configure gave it is released before the VM starts (fixed.go says
// why, from Proxmox's source).
func TestFixedAddressOrder(t *testing.T) {
	e, px := fixedEngine(t)
	req := apitype.CreateRequest{Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "10.30.0.0/24"}}, TTLSeconds: 60,
		VMs: []apitype.VMRequest{{Name: "web", Template: "debian", Cores: 1, MemoryMiB: 512, Networks: []string{"lan"},
			NICs: []apitype.NIC{{Network: "lan", IPv4: "10.30.0.10"}}}}}
	sb, err := e.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, op := range px.CallTrace() {
		if slices.Contains([]string{"ApplySDN", "ReserveIP", "ConfigureVM", "ReleaseIP", "StartVM"}, op) {
			steps = append(steps, op)
		}
	}
	if want := []string{"ApplySDN", "ReserveIP", "ConfigureVM", "ReleaseIP", "StartVM"}; !slices.Equal(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}
	vm, _ := px.VMByID(sb.VMs[0].VMID)
	mac := sb.VMs[0].NICs[0].MAC
	if !daemonMAC.MatchString(mac) || !slices.Equal(vm.Config.MACs, []string{mac}) {
		t.Errorf("NIC MAC %q, configured %v: want one the daemon picked, configured", mac, vm.Config.MACs)
	}
	if got := sb.VMs[0].Addresses; !slices.Equal(got, []apitype.VMAddress{{Network: "lan", IPv4: "10.30.0.10"}}) {
		t.Errorf("addresses %+v, want the fixed one", got)
	}
}

// TestFixedAddresses: VMs with fixed addresses (one with its MAC given,
// one without) and a VM without: each fixed NIC has its address in the
// API, the MAC it was configured with, the other VM's range address is
// none of the fixed ones (reserved before any NIC was configured), a
// NIC's MAC alone is configured as given; another sandbox asking one of
// the MACs is refused; the delete leaves no IPAM entry.
func TestFixedAddresses(t *testing.T) {
	ctx := context.Background()
	e, px := fixedEngine(t)
	req := apitype.CreateRequest{TTLSeconds: 60,
		Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "10.30.0.0/24"}, {Name: "wan", CIDR: "auto"}},
		VMs: []apitype.VMRequest{
			{Name: "a", Template: "debian", Cores: 1, MemoryMiB: 512, Networks: []string{"lan"}, NICs: []apitype.NIC{{Network: "lan", IPv4: "10.30.0.10"}}},
			{Name: "b", Template: "debian", Cores: 1, MemoryMiB: 512, Networks: []string{"wan", "lan"},
				NICs: []apitype.NIC{{Network: "wan", MAC: "BC:24:11:00:00:0B"}, {Network: "lan", MAC: "52:54:00:12:34:56", IPv4: "10.30.0.11"}}},
			{Name: "c", Template: "debian", Cores: 1, MemoryMiB: 512, Networks: []string{"lan"}},
		}}
	sb, err := e.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := e.Get(sb.ID)
	a, b, c := got.VMs[0], got.VMs[1], got.VMs[2]
	if !slices.Equal(a.Addresses, []apitype.VMAddress{{Network: "lan", IPv4: "10.30.0.10"}}) {
		t.Errorf("a: addresses %+v", a.Addresses)
	}
	if len(b.Addresses) != 2 || b.Addresses[1] != (apitype.VMAddress{Network: "lan", IPv4: "10.30.0.11"}) {
		t.Errorf("b: addresses %+v, want 10.30.0.11 on lan", b.Addresses)
	}
	if len(c.Addresses) != 1 || c.Addresses[0].IPv4 == "10.30.0.10" || c.Addresses[0].IPv4 == "10.30.0.11" || c.NICs != nil {
		t.Errorf("c: addresses %+v NICs %+v, want a range address of its own and no NICs listed", c.Addresses, c.NICs)
	}
	vb, _ := px.VMByID(b.VMID)
	if want := []string{"BC:24:11:00:00:0B", "52:54:00:12:34:56"}; !slices.Equal(vb.Config.MACs, want) || b.NICs[1].MAC != want[1] {
		t.Errorf("b: configured MACs %v, NICs %+v, want %v", vb.Config.MACs, b.NICs, want)
	}
	if n := len(px.Reserved()); n != 2 {
		t.Errorf("%d reserved entries, want 2", n)
	}
	// b's MAC in another sandbox is refused
	again := oneVM("debian")
	again.VMs[0].NICs = []apitype.NIC{{Network: "net0", MAC: "52:54:00:12:34:56"}}
	if _, err := e.Create(ctx, again); !errors.Is(err, sandbox.ErrConflict) || !strings.Contains(err.Error(), "sandbox "+sb.ID+"'s VM b has it") {
		t.Errorf("a MAC of a live sandbox's VM: %v, want a conflict naming it", err)
	}
	if err := e.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if left := px.Reserved(); len(left) != 0 {
		t.Errorf("IPAM entries left after the delete: %+v", left)
	}
}

// TestFixedAddressTaken: a reservation Proxmox refuses (the address its
// IPAM holds already) fails the create, and everything goes.
func TestFixedAddressTaken(t *testing.T) {
	ctx := context.Background()
	e, px := fixedEngine(t)
	px.FailOnce("ReserveIP", errors.New("IP '10.30.0.10' already exist"))
	req := apitype.CreateRequest{Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "10.30.0.0/24"}}, TTLSeconds: 60,
		VMs: []apitype.VMRequest{{Name: "web", Template: "debian", Cores: 1, MemoryMiB: 512, Networks: []string{"lan"},
			NICs: []apitype.NIC{{Network: "lan", IPv4: "10.30.0.10"}}}}}
	if _, err := e.Create(ctx, req); err == nil || !regexp.MustCompile(`reserve 10\.30\.0\.10 .*already exist`).MatchString(err.Error()) {
		t.Fatalf("create: %v, want the reservation's refusal", err)
	}
	if ids := px.VMIDs(); len(ids) != 0 {
		t.Errorf("VMs left: %v", ids)
	}
	if z, v, s := px.SDNObjects(); z+v+s != 0 {
		t.Errorf("SDN objects left: %d zones, %d vnets, %d subnets", z, v, s)
	}
}
