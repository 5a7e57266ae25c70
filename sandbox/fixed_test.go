package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

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

// TestFixedMACConflictNamesOwnOnly: a create fixing a MAC a VM of another
// of the node's sandboxes has is refused; the refusal names that sandbox
// and VM only to the sandbox's own owner (the API hides other owners'
// sandboxes: their ids and VM names are not told through a refusal).
func TestFixedMACConflictNamesOwnOnly(t *testing.T) {
	for _, tc := range []struct {
		name, owner string
		named       bool
	}{
		{"same owner", "alice", true},
		{"another owner", "bob", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e, px := fixedEngine(t)
			first := oneVM("debian")
			first.Owner = "alice"
			first.VMs[0].Name = "secretvm"
			first.VMs[0].NICs = []apitype.NIC{{Network: "net0", MAC: "52:54:00:12:34:56"}}
			sb, err := e.Create(ctx, first)
			if err != nil {
				t.Fatal(err)
			}
			muts := px.Mutations()
			again := oneVM("debian")
			again.Owner = tc.owner
			again.VMs[0].NICs = []apitype.NIC{{Network: "net0", MAC: "52:54:00:12:34:56"}}
			_, err = e.Create(ctx, again)
			if !errors.Is(err, sandbox.ErrConflict) {
				t.Fatalf("create: %v, want a conflict", err)
			}
			if named := strings.Contains(err.Error(), sb.ID) || strings.Contains(err.Error(), "secretvm"); named != tc.named {
				t.Errorf("refusal %q names the sandbox or its VM: %v, want %v", err, named, tc.named)
			}
			if n := px.Mutations() - muts; n != 0 {
				t.Errorf("the refusal made %d changes in Proxmox, want none", n)
			}
		})
	}
}

// TestFixedMACOfAnotherNode: Proxmox caches a MAC's address cluster-wide
// by the MAC alone (pve-network Ipams.pm add_cache_mac_ip,
// get_ips_from_mac), and a zone's dnsmasq drops a MAC's mapping whose
// address the cache names otherwise (Dhcp/Dnsmasq.pm add_ip_mapping): a
// MAC another node's sandbox (or any VM of the cluster) has on a vnet of
// Proxmox's IPAM is refused before anything is made, as one of this
// node's sandboxes is.
func TestFixedMACOfAnotherNode(t *testing.T) {
	ctx := context.Background()
	g := apitest.NewGuests()
	px := apitest.NewProxmox(g, map[string]int{"debian": 9000})
	onNode := func(node string) *sandbox.Engine {
		return newEngine(t, func(o *sandbox.Options) { o.Node, o.Proxmox, o.Guests = node, px, g.Dial })
	}
	e1, e2 := onNode("node1"), onNode("node2")
	for i, tc := range []struct {
		name string
		nic  apitype.NIC
	}{
		{"the MAC alone", apitype.NIC{Network: "net0", MAC: "52:54:00:12:34:56"}},
		{"the MAC with a fixed address", apitype.NIC{Network: "net0", MAC: "52:54:00:12:34:57", IPv4: "10.51.0.5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			there := oneVM("debian")
			there.Networks[0].CIDR = fmt.Sprintf("10.4%d.0.0/24", i+1)
			there.VMs[0].NICs = []apitype.NIC{{Network: "net0", MAC: strings.ToLower(tc.nic.MAC)}}
			if _, err := e2.Create(ctx, there); err != nil {
				t.Fatal(err)
			}
			here := oneVM("debian")
			here.Networks[0].CIDR = fmt.Sprintf("10.5%d.0.0/24", i)
			here.VMs[0].NICs = []apitype.NIC{tc.nic}
			zones, _, _ := px.SDNObjects()
			reserved := px.Calls["ReserveIP"]
			if _, err := e1.Create(ctx, here); !errors.Is(err, sandbox.ErrConflict) || !strings.Contains(err.Error(), tc.nic.MAC) {
				t.Fatalf("create on node1 with node2's MAC: %v, want a conflict naming the MAC", err)
			}
			if z, _, _ := px.SDNObjects(); z != zones || px.Calls["ReserveIP"] != reserved {
				t.Errorf("the refusal made something: %d zones (were %d), %d reservations (were %d)", z, zones, px.Calls["ReserveIP"], reserved)
			}
		})
	}
}

// cacheRacePX is the fake Proxmox with the MAC cache's race made to
// happen: the start of a VM with a fixed MAC (first) waits, for a while,
// for a release of the other fixed MAC's range address (second), which
// waits to be configured until first's start began. On Proxmox that start
// is a cache miss whose unlocked write of the whole cache (pve-network
// Ipams.pm get_ips_from_mac: read_macdb, then write_macdb without
// cfs_lock_file) can put back the cached range address the release just
// dropped (Subnets.pm del_ip -> del_cache_mac_ip, under the lock): the
// second NIC's start then maps the range address. overlaps counts the
// releases made while such a start ran.
type cacheRacePX struct {
	*apitest.Proxmox
	first, second string
	began         chan struct{}
	released      chan struct{}
	once          sync.Once
	mu            sync.Mutex
	starting      int
	overlaps      int
}

func (p *cacheRacePX) has(id int, mac string) bool {
	v, ok := p.VMByID(id)
	return ok && slices.Contains(v.Config.MACs, mac)
}

func (p *cacheRacePX) ConfigureVM(ctx context.Context, id int, c sandbox.VMConfig) error {
	if slices.Contains(c.MACs, p.second) {
		select {
		case <-p.began:
		case <-ctx.Done():
		}
	}
	return p.Proxmox.ConfigureVM(ctx, id, c)
}

func (p *cacheRacePX) StartVM(ctx context.Context, id int) error {
	if p.has(id, p.first) || p.has(id, p.second) {
		p.mu.Lock()
		p.starting++
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			p.starting--
			p.mu.Unlock()
		}()
	}
	if p.has(id, p.first) {
		close(p.began)
		select {
		case <-p.released:
		case <-time.After(500 * time.Millisecond): // the release waits for this start
		}
	}
	return p.Proxmox.StartVM(ctx, id)
}

func (p *cacheRacePX) ReleaseIP(ctx context.Context, zone, vnet string, ip netip.Addr, mac string) error {
	p.mu.Lock()
	if p.starting > 0 {
		p.overlaps++
	}
	p.mu.Unlock()
	if mac == p.second {
		p.once.Do(func() { close(p.released) })
	}
	return p.Proxmox.ReleaseIP(ctx, zone, vnet, ip, mac)
}

// TestFixedAddressDropWaitsForStarts: the release of a range address a
// configure gave a NIC of a fixed address (which drops the MAC's cached
// address in Proxmox) never runs while a start of a VM with a fixed
// address does (whose cache miss rewrites the whole cache unlocked, and
// could put the dropped address back: cacheRacePX); both VMs get their
// fixed addresses.
func TestFixedAddressDropWaitsForStarts(t *testing.T) {
	ctx := context.Background()
	var rp *cacheRacePX
	e := newEngine(t, func(o *sandbox.Options) {
		rp = &cacheRacePX{Proxmox: o.Proxmox.(*apitest.Proxmox), first: "52:54:00:00:00:0A", second: "52:54:00:00:00:0B",
			began: make(chan struct{}), released: make(chan struct{})}
		o.Proxmox = rp
	})
	req := apitype.CreateRequest{Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "10.30.0.0/24"}}, TTLSeconds: 60,
		VMs: []apitype.VMRequest{
			{Name: "a", Template: "debian", Cores: 1, MemoryMiB: 512, NICs: []apitype.NIC{{Network: "lan", MAC: rp.first, IPv4: "10.30.0.5"}}},
			{Name: "b", Template: "debian", Cores: 1, MemoryMiB: 512, NICs: []apitype.NIC{{Network: "lan", MAC: rp.second, IPv4: "10.30.0.6"}}},
		}}
	for i := range req.VMs {
		req.VMs[i].Networks = []string{"lan"}
	}
	sb, err := e.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	rp.mu.Lock()
	overlaps := rp.overlaps
	rp.mu.Unlock()
	if overlaps != 0 {
		t.Errorf("%d releases ran during a start of a VM with a fixed address", overlaps)
	}
	for i, want := range []string{"10.30.0.5", "10.30.0.6"} {
		if got := sb.VMs[i].Addresses; len(got) != 1 || got[0].IPv4 != want {
			t.Errorf("%s: addresses %+v, want %s", sb.VMs[i].Name, got, want)
		}
	}
}
