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
			r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, net.JoinHostPort(gw, "53"))
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
