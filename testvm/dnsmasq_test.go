package testvm

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestDnsmasqRestartsAndEthers: a guest gets the address its MAC is mapped
// to in the zone's ethers file (as Proxmox maps a VM's IPAM address at its
// start); every zone's dnsmasq restarting, as on each SDN apply, leaves
// the guests their addresses and their zone's DNS.
func TestDnsmasqRestartsAndEthers(t *testing.T) {
	testkit.RequireRoot(t, "dnsmasq")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := Up(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	for _, z := range twoZones() {
		if err := b.AddZone(ctx, z); err != nil {
			t.Fatal(err)
		}
	}
	want := netip.MustParseAddr("10.10.1.150")
	ga, err := b.StartGuest(ctx, GuestSpec{VMID: 101, VNet: "vneta", IP: want})
	if err != nil {
		t.Fatal(err)
	}
	gb, err := b.StartGuest(ctx, GuestSpec{VMID: 102, VNet: "vnetb"})
	if err != nil {
		t.Fatal(err)
	}
	if ga.IPv4() != want {
		t.Fatalf("guest 101 got %v, want its ethers address %v", ga.IPv4(), want)
	}
	// A MAC that is not in the ethers file gets no lease (as a NIC
	// Proxmox never mapped): one DHCP client, a few seconds.
	if got := unknownMACLease(t, ctx, b, "vneta"); got != "" {
		t.Errorf("a MAC missing from ethers got a lease: %s", got)
	}
	ethers, err := os.ReadFile(b.ethersFile("zoneb"))
	if err != nil || !strings.Contains(string(ethers), gb.MAC.String()) {
		t.Fatalf("zoneb ethers %q %v: want %s listed", ethers, err, gb.MAC)
	}
	before := map[string]int{"zonea": b.DnsmasqPID("zonea"), "zoneb": b.DnsmasqPID("zoneb")}
	for range 3 {
		if err := b.RestartDnsmasq(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for z, pid := range before {
		if now := b.DnsmasqPID(z); now == 0 || now == pid {
			t.Errorf("dnsmasq of %s: pid %d before, %d after the restarts", z, pid, now)
		}
	}
	// Past a few renewals (every second) the guests keep their addresses
	// and resolve their zone's name.
	time.Sleep(3 * time.Second)
	for _, c := range []struct {
		g    *Guest
		zone string
		addr netip.Addr
	}{{ga, "zonea", want}, {gb, "zoneb", gb.IPv4()}} {
		if got := guestIPv4(c.g.NS); got != c.addr {
			t.Errorf("guest %d: address %v after the restarts, want %v", c.g.VMID, got, c.addr)
		}
		gw := map[string]string{"zonea": "10.10.1.1", "zoneb": "10.10.2.1"}[c.zone]
		var answer string
		err := b.Do(c.g.NS, func() error {
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(LocalName(c.zone)), dns.TypeA)
			r, _, err := (&dns.Client{Timeout: time.Minute}).Exchange(m, net.JoinHostPort(gw, "53"))
			if err != nil {
				return err
			}
			if len(r.Answer) > 0 {
				if a, ok := r.Answer[0].(*dns.A); ok {
					answer = a.A.String()
				}
			}
			return nil
		})
		if err != nil || answer != gw {
			t.Errorf("guest %d: %s resolves to %q (%v), want %s", c.g.VMID, LocalName(c.zone), answer, err, gw)
		}
	}
}

// unknownMACLease plugs a namespace with a MAC the zone's ethers file does
// not list into vnet, runs one dhclient try and returns the IPv4 address
// it got ("" for none).
func unknownMACLease(t *testing.T, ctx context.Context, b *Bed, vnet string) string {
	t.Helper()
	ns, host, peer := b.Name()+"-unk", b.Name()+"hu", b.Name()+"gu"
	t.Cleanup(func() {
		_ = exec.Command("ip", "-n", b.NodeNS(), "link", "del", host).Run()
		_ = exec.Command("ip", "netns", "del", ns).Run()
	})
	for _, st := range [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "link", "add", host, "type", "veth", "peer", "name", peer},
		{"ip", "link", "set", host, "netns", b.NodeNS()},
		{"ip", "link", "set", peer, "netns", ns},
		{"ip", "-n", b.NodeNS(), "link", "set", host, "master", vnet, "up"},
		{"ip", "-n", ns, "link", "set", peer, "address", "bc:24:11:ee:ee:ee", "up"},
	} {
		if err := run(ctx, st...); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "dhclient.conf")
	if err := os.WriteFile(conf, []byte("timeout 5;\nretry 1;\ninitial-interval 1;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// -1: one try, exit 2 without a lease.
	_ = exec.CommandContext(ctx, "ip", "netns", "exec", ns, "dhclient", "-1", "-4", "-sf", "/bin/true", "-cf", conf,
		"-lf", filepath.Join(dir, "leases"), "-pf", filepath.Join(dir, "pid"), peer).Run()
	leases, _ := os.ReadFile(filepath.Join(dir, "leases"))
	if i := strings.Index(string(leases), "fixed-address "); i >= 0 {
		return strings.TrimSuffix(strings.Fields(string(leases)[i+len("fixed-address "):])[0], ";")
	}
	return ""
}

// TestApplyZoneInPlace: a guest started on a zone whose bridge still has
// an older subnet (its move not applied on the node yet: a lost reload)
// is mapped to an address of the new one and gets no lease; applying the
// zone with its new subnet keeps the guest attached and the zone's ethers,
// so the guest gets its address, as on a Proxmox node where ifreload
// changes the bridge in place and the ethers file stays.
func TestApplyZoneInPlace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, old := upZoneA(t, ctx)
	moved := Zone{ID: old.ID, VNets: []VNet{{Name: "vneta", Subnet: netip.MustParsePrefix("10.10.7.0/24"), Gateway: netip.MustParseAddr("10.10.7.1"),
		DHCP: []DHCPRange{{Start: netip.MustParseAddr("10.10.7.100"), End: netip.MustParseAddr("10.10.7.200")}}, SNAT: true}}}
	want := netip.MustParseAddr("10.10.7.150")
	type started struct {
		g   *Guest
		err error
	}
	done := make(chan started, 1)
	go func() {
		g, err := b.StartGuest(ctx, GuestSpec{VMID: 101, VNet: "vneta", IP: want})
		done <- started{g, err}
	}()
	// The guest asks in vain while the bridge has the old subnet.
	select {
	case s := <-done:
		t.Fatalf("the guest started on the old subnet: %+v", s)
	case <-time.After(3 * time.Second):
	}
	if err := b.ApplyZone(ctx, moved); err != nil {
		t.Fatal(err)
	}
	s := <-done
	if s.err != nil {
		t.Fatalf("guest after the zone's apply: %v", s.err)
	}
	if s.g.IPv4() != want {
		t.Errorf("guest got %v, want %v", s.g.IPv4(), want)
	}
	ethers, err := os.ReadFile(b.ethersFile(old.ID))
	if err != nil || !strings.Contains(string(ethers), s.g.MAC.String()) {
		t.Errorf("ethers after the apply %q %v: want %s listed", ethers, err, s.g.MAC)
	}
}

// TestAddZoneOnAMovingZonesGateway: a new zone whose subnet another zone
// still has on its bridge (that zone moved in the same apply and is
// applied after it) starts its dnsmasq all the same, as on a Proxmox node
// where the reload has stopped every dnsmasq first; once the other zone is
// applied, both resolve on their gateways.
func TestAddZoneOnAMovingZonesGateway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, x := upZoneA(t, ctx)
	d := Zone{ID: "zoned", VNets: []VNet{x.VNets[0]}}
	d.VNets[0].Name = "vnetd"
	if err := b.AddZone(ctx, d); err != nil {
		t.Fatalf("a zone on the gateway of one that moves: %v", err)
	}
	x.VNets[0].Subnet, x.VNets[0].Gateway = netip.MustParsePrefix("10.10.8.0/24"), netip.MustParseAddr("10.10.8.1")
	x.VNets[0].DHCP = []DHCPRange{{Start: netip.MustParseAddr("10.10.8.100"), End: netip.MustParseAddr("10.10.8.200")}}
	if err := b.ApplyZone(ctx, x); err != nil {
		t.Fatal(err)
	}
	for _, z := range []Zone{x, d} {
		if !b.dnsReady(z) || b.DnsmasqPID(z.ID) == 0 {
			t.Errorf("zone %s: resolver on %s does not answer", z.ID, z.VNets[0].Gateway)
		}
	}
}

// upZoneA brings up a bed (closed when the test ends) with the first of
// twoZones, which it returns.
func upZoneA(t *testing.T, ctx context.Context) (*Bed, Zone) {
	t.Helper()
	z := twoZones()[0]
	return upZone(t, ctx, z), z
}

// upZone is a bed (closed at the test's end) running zone z.
func upZone(t *testing.T, ctx context.Context, z Zone) *Bed {
	t.Helper()
	testkit.RequireRoot(t, "dnsmasq")
	b, err := Up(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.AddZone(ctx, z); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEthersAddressGivenAgain: a MAC the IPAM gives an address again,
// after the VM that had it is gone (a build VM destroyed, the next build's
// VM given the lowest free address), gets a lease: the old MAC's line goes
// from the ethers file, as pve-network's add_ip_mapping drops lines the
// IPAM's MAC cache no longer backs, instead of staying as the first
// dhcp-host of the address, for which dnsmasq ignores the new MAC's line
// (and, with dhcp-ignore=tag:!known, the new MAC). Which address it leases
// is dnsmasq's: the old MAC's lease holds the configured one until it
// ends (the bed does not emulate update_lease's AddDhcpLease).
func TestEthersAddressGivenAgain(t *testing.T) {
	testkit.RequireRoot(t, "dnsmasq")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := Up(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.AddZone(ctx, twoZones()[0]); err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddr("10.10.1.100")
	first, err := b.StartGuest(ctx, GuestSpec{VMID: 101, VNet: "vneta", IP: addr})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.StopGuest(ctx, 101); err != nil {
		t.Fatal(err)
	}
	second, err := b.StartGuest(ctx, GuestSpec{VMID: 102, VNet: "vneta", IP: addr})
	if err != nil {
		t.Fatalf("a second MAC given the address again: %v", err)
	}
	if !second.IPv4().IsValid() {
		t.Errorf("guest 102 got no address")
	}
	ethers, err := os.ReadFile(b.ethersFile("zonea"))
	if err != nil || strings.Contains(string(ethers), first.MAC.String()) || !strings.Contains(string(ethers), second.MAC.String()+","+addr.String()) {
		t.Errorf("ethers %q %v: want only %s at %s", ethers, err, second.MAC, addr)
	}
}

// TestEthersAddressOfRunningGuestKept: the address of a guest that still
// runs is not given to another MAC by dropping the running guest's ethers
// line. pve-network's add_ip_mapping drops only lines whose MAC the IPAM's
// MAC cache no longer backs at that address (Dnsmasq.pm add_ip_mapping,
// "delete changed"): a running guest's MAC is still there, so its line
// stays and a second MAC mapped to the same address gets no lease (dnsmasq
// ignores a duplicate dhcp-host address). The IPAM giving one address to
// two live NICs is a bug the bed must show, not paper over.
func TestEthersAddressOfRunningGuestKept(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, _ := upZoneA(t, ctx)
	addr := netip.MustParseAddr("10.10.1.100")
	first, err := b.StartGuest(ctx, GuestSpec{VMID: 101, VNet: "vneta", IP: addr})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.StartGuest(ctx, GuestSpec{VMID: 102, VNet: "vneta", IP: addr})
	if err == nil || !strings.Contains(err.Error(), addr.String()) {
		t.Errorf("a second MAC given running guest 101's address: %v, want an error naming %s", err, addr)
	}
	ethers, err := os.ReadFile(b.ethersFile("zonea"))
	if err != nil || !strings.Contains(string(ethers), first.MAC.String()+","+addr.String()) {
		t.Errorf("ethers %q %v: running guest 101's line %s,%s was dropped", ethers, err, first.MAC, addr)
	}
}

// TestStaticDHCPServesMappedAddresses: a vnet without ranges in a DHCP
// zone (StaticDHCP) is served as a current Proxmox zone's dnsmasq serves
// a subnet without dhcp-range (pve-network Dnsmasq.pm configure_subnet: a
// static range of the subnet): a guest whose MAC is mapped to an address
// leases exactly that address, with the gateway as its route; one mapped
// to none gets no address (dhcp-ignore=tag:!known and a static range
// hand out nothing else) and is up without it.
func TestStaticDHCPServesMappedAddresses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b := upZone(t, ctx, Zone{ID: "zones", VNets: []VNet{{Name: "vnets", Subnet: netip.MustParsePrefix("10.10.7.0/24"),
		Gateway: netip.MustParseAddr("10.10.7.1"), StaticDHCP: true}}})
	addr := netip.MustParseAddr("10.10.7.2")
	mapped, err := b.StartGuest(ctx, GuestSpec{VMID: 101, VNet: "vnets", IP: addr})
	if err != nil {
		t.Fatal(err)
	}
	if got := mapped.IPv4(); got != addr {
		t.Errorf("guest mapped to %s leased %v", addr, got)
	}
	unmapped, err := b.StartGuest(ctx, GuestSpec{VMID: 102, VNet: "vnets"})
	if err != nil {
		t.Fatal(err)
	}
	// the unmapped guest's dhclient has had the time the mapped one took
	time.Sleep(2 * time.Second)
	if got := guestIPv4(unmapped.NS); got.IsValid() {
		t.Errorf("guest mapped to no address leased %s", got)
	}
}
