package e2e_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestBedFixedAddress is issue 37's static addresses on the bed: a VM
// asking an address outside the DHCP range (.5) and one asking the range's
// first (.10, which the third VM's NIC would otherwise get) have them, in
// the API's addresses and in the guest (the zone's dnsmasq hands each its
// address by its MAC, as Proxmox's IPAM DHCP mapping makes it); the third
// VM has another and resolves the first by name to its fixed address; the
// delete leaves no IPAM entry.
func TestBedFixedAddress(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := newBedEnv(t, ctx, nil)
	sb, err := e.c.Create(ctx, apitype.CreateRequest{
		Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "10.79.0.0/24"}},
		VMs: []apitype.VMRequest{
			{Name: "web", Template: "debian", NICs: []apitype.NIC{{Network: "lan", IPv4: "10.79.0.5"}}},
			{Name: "db", Template: "debian", NICs: []apitype.NIC{{Network: "lan", MAC: "52:54:00:12:34:56", IPv4: "10.79.0.10"}}},
			{Name: "cli", Template: "debian", Networks: []string{"lan"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.Background(), sb.ID) })
	checkFixedOnBed(t, ctx, e, sb, netip.MustParsePrefix("10.79.0.0/24"), map[string]string{"web": "10.79.0.5", "db": "10.79.0.10"}, "db", "52:54:00:12:34:56")
}

// checkFixedOnBed checks bed sandbox sb of fixed addresses on prefix, then
// deletes it: each VM has one address, fixed[its name] when it asks one,
// else another host address of prefix than the fixed ones and the gateway
// (the first); that address is its eth0's by DHCP; VM macVM has MAC mac;
// cli resolves web to its fixed address; the delete leaves no IPAM entry.
func checkFixedOnBed(t *testing.T, ctx context.Context, e *bedEnv, sb apitype.Sandbox, prefix netip.Prefix, fixed map[string]string, macVM, mac string) {
	t.Helper()
	run := func(vm, script string) string {
		t.Helper()
		res, err := e.c.Exec(ctx, sb.ID, vm, apitype.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, TimeoutSeconds: 20})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 {
			t.Errorf("%s: %q: exit %d: %s", vm, script, res.ExitCode, res.Stderr)
		}
		return strings.TrimSpace(string(res.Stdout))
	}
	taken := map[string]bool{prefix.Addr().Next().String(): true}
	for _, a := range fixed {
		taken[a] = true
	}
	for _, v := range sb.VMs {
		if len(v.Addresses) != 1 {
			t.Errorf("%s: addresses %+v, want one", v.Name, v.Addresses)
			continue
		}
		got := v.Addresses[0].IPv4
		want, ok := fixed[v.Name]
		if a, err := netip.ParseAddr(got); ok && got != want || !ok && (err != nil || !prefix.Contains(a) || taken[got]) {
			t.Errorf("%s: address %s, want %q (empty: another host address of %s than the fixed ones and the gateway)", v.Name, got, want, prefix)
			continue
		}
		if out := run(v.Name, "ip -4 -o addr show dev eth0"); !strings.Contains(out, " "+got+"/24 ") {
			t.Errorf("%s: eth0 %q, want %s by DHCP", v.Name, out, got)
		}
	}
	if out := run(macVM, "cat /sys/class/net/eth0/address"); out != mac {
		t.Errorf("%s's MAC %q, want %s", macVM, out, mac)
	}
	if out := run("cli", "getent hosts web"); strings.Join(strings.Fields(out), " ") != fixed["web"]+" web" {
		t.Errorf("getent hosts web in cli: %q, want %s", out, fixed["web"])
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := e.emu.IPAMEntries(sb.ID); len(got) != 0 {
		t.Errorf("IPAM entries left: %q", got)
	}
	if v := e.emu.Violations(); len(v) != 0 {
		t.Errorf("schema violations: %+v", v)
	}
}

// TestBedFixedAddressWithoutDHCP: on a network of "dhcp": false (a subnet
// without a dhcp-range, which a node's zone dnsmasq serves through a
// static range of the subnet: pve-network Dhcp/Dnsmasq.pm
// configure_subnet), a VM asking the prefix's first free address (.2, the
// one Proxmox's IPAM would hand a NIC there first: Ipams/PVEPlugin.pm
// add_next_freeip) gets it by DHCP, its MAC mapped at start (Vnets.pm
// add_dhcp_mapping); a sibling without a fixed address gets another of
// the prefix by DHCP and resolves the first by name to its fixed address;
// the delete leaves no IPAM entry.
func TestBedFixedAddressWithoutDHCP(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := newBedEnv(t, ctx, nil)
	off := false
	prefix := netip.MustParsePrefix("10.78.0.0/24")
	sb, err := e.c.Create(ctx, apitype.CreateRequest{
		Networks: []apitype.NetworkRequest{{Name: "dark", CIDR: prefix.String(), DHCP: &off}},
		VMs: []apitype.VMRequest{
			{Name: "web", Template: "debian", NICs: []apitype.NIC{{Network: "dark", MAC: "52:54:00:12:34:57", IPv4: "10.78.0.2"}}},
			{Name: "cli", Template: "debian", Networks: []string{"dark"}},
		},
	})
	if err != nil {
		t.Fatalf("create with a fixed address on a dhcp:false network: %v", err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.Background(), sb.ID) })
	if sb.Networks[0].DHCP || len(sb.Networks[0].DHCPRanges) != 0 {
		t.Errorf("network %+v, want one without DHCP ranges", sb.Networks[0])
	}
	static := fmt.Sprintf("--dhcp-range=set:%s,%s,static,", sb.Networks[0].VNet, prefix.Addr())
	if ranges := dnsmasqRanges(t, e, sb.Zone); len(ranges) != 1 || !strings.HasPrefix(ranges[0], static) {
		t.Errorf("dnsmasq dhcp ranges %q, want %s's static one alone", ranges, sb.Networks[0].VNet)
	}
	checkFixedOnBed(t, ctx, e, sb, prefix, map[string]string{"web": "10.78.0.2"}, "web", "52:54:00:12:34:57")
}
