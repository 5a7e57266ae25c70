package e2e_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestEmulatorFixedAddress: a VM asking a fixed address (the first of the
// DHCP range, which its sibling's NIC would otherwise take) and one asking
// a MAC, with the token pve-access-setup makes: the API reports the fixed
// address, the IPAM holds only it for the NIC's MAC (the range address the
// configure gave the NIC is gone), the start mapped it for the zone's DHCP,
// the sibling has another; the delete leaves no IPAM entry and nothing of
// the MACs in Proxmox's MAC cache.
func TestEmulatorFixedAddress(t *testing.T) {
	e := newEmuEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := e.c.Create(ctx, apitype.CreateRequest{
		Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "10.77.0.0/24"}},
		VMs: []apitype.VMRequest{
			{Name: "web", Template: "debian", NICs: []apitype.NIC{{Network: "lan", IPv4: "10.77.0.10"}}},
			{Name: "db", Template: "debian", NICs: []apitype.NIC{{Network: "lan", MAC: "52:54:00:12:34:56"}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	web, db := sb.VMs[0], sb.VMs[1]
	mac := web.NICs[0].MAC
	if !slices.Equal(web.Addresses, []apitype.VMAddress{{Network: "lan", IPv4: "10.77.0.10"}}) || mac == "" {
		t.Fatalf("web: addresses %+v NICs %+v, want the fixed address and the MAC the daemon picked", web.Addresses, web.NICs)
	}
	if len(db.Addresses) != 1 || db.Addresses[0].IPv4 == "10.77.0.10" || db.NICs[0].MAC != "52:54:00:12:34:56" {
		t.Fatalf("db: addresses %+v NICs %+v", db.Addresses, db.NICs)
	}
	checkFixedEntry(t, e, sb.ID, "10.77.0.0/24", "10.77.0.10", mac, "mac=52:54:00:12:34:56 ip="+db.Addresses[0].IPv4)
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t, ctx)
	if got := e.emu.IPAMEntries(sb.ID); len(got) != 0 {
		t.Errorf("IPAM entries left: %q", got)
	}
	for _, l := range e.emu.MACCache() {
		if strings.HasPrefix(l, mac+" ") || strings.HasPrefix(l, "52:54:00:12:34:56 ") {
			t.Errorf("MAC cache entry left: %q", l)
		}
	}
}

// TestEmulatorFixedAddressWithoutDHCP: a fixed address on a network of
// "dhcp": false (a subnet without a dhcp-range) is taken, and it is the
// prefix's first free one (.2), which a sibling's NIC would otherwise get
// (pve-network Ipams/PVEPlugin.pm add_next_freeip): the API reports it,
// the IPAM holds only it for the NIC's MAC, the start mapped it for the
// zone's DHCP (Vnets.pm add_dhcp_mapping), and the sibling has another
// address of the prefix.
func TestEmulatorFixedAddressWithoutDHCP(t *testing.T) {
	e := newEmuEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	off := false
	sb, err := e.c.Create(ctx, apitype.CreateRequest{
		Networks: []apitype.NetworkRequest{{Name: "dark", CIDR: "10.78.0.0/24", DHCP: &off}},
		VMs: []apitype.VMRequest{
			{Name: "web", Template: "debian", NICs: []apitype.NIC{{Network: "dark", IPv4: "10.78.0.2"}}},
			{Name: "cli", Template: "debian", Networks: []string{"dark"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	web, cli := sb.VMs[0], sb.VMs[1]
	mac := web.NICs[0].MAC
	if sb.Networks[0].DHCP || len(sb.Networks[0].DHCPRanges) != 0 {
		t.Errorf("network %+v, want one without DHCP ranges", sb.Networks[0])
	}
	if !slices.Equal(web.Addresses, []apitype.VMAddress{{Network: "dark", IPv4: "10.78.0.2"}}) || mac == "" {
		t.Fatalf("web: addresses %+v NICs %+v, want the fixed address and the MAC the daemon picked", web.Addresses, web.NICs)
	}
	if len(cli.Addresses) != 1 || cli.Addresses[0].IPv4 == "10.78.0.2" || cli.Addresses[0].IPv4 == "10.78.0.1" ||
		!netip.MustParsePrefix("10.78.0.0/24").Contains(netip.MustParseAddr(cli.Addresses[0].IPv4)) {
		t.Fatalf("cli: addresses %+v, want another address of 10.78.0.0/24", cli.Addresses)
	}
	checkFixedEntry(t, e, sb.ID, "10.78.0.0/24", "10.78.0.2", mac)
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t, ctx)
	if got := e.emu.IPAMEntries(sb.ID); len(got) != 0 {
		t.Errorf("IPAM entries left: %q", got)
	}
}

// checkFixedEntry checks that the IPAM holds one entry of MAC mac in
// sandbox id, fixed address ip of subnet cidr, and that a start mapped
// it, and each of the other mappings ("mac=.. ip=..").
func checkFixedEntry(t *testing.T, e *emuEnv, id, cidr, ip, mac string, others ...string) {
	t.Helper()
	var of []string
	for _, l := range e.emu.IPAMEntries(id) {
		if strings.HasSuffix(l, " "+mac) {
			of = append(of, l)
		}
	}
	if want := []string{cidr + " " + ip + " " + mac}; !slices.Equal(of, want) {
		t.Errorf("IPAM entries of %s %q, want %q alone", mac, of, want)
	}
	started := strings.Join(e.fb.Calls(), "\n")
	for _, line := range append([]string{"mac=" + strings.ToLower(mac) + " ip=" + ip}, others...) {
		if !strings.Contains(started, line) {
			t.Errorf("no start mapped %q:\n%s", line, started)
		}
	}
}
