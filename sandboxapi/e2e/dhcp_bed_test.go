package e2e_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestBedNetworkWithoutDHCP: a sandbox whose VMs are on a network of
// "dhcp": false (a Proxmox subnet without dhcp-range) is created, its
// guest gets the address a Proxmox node gives it (the first free one of
// the prefix after the network address, .2: pve-network PVEPlugin.pm
// add_next_freeip, served by the zone's dnsmasq through a static range of
// the subnet, Dnsmasq.pm configure_subnet), the API reports that address,
// exec works, and the delete leaves no VM, vnet, bridge or dnsmasq
// behind. schemathesis found such a create answered 502: the bed's SDN
// apply refused a vnet without a DHCP range ("bad DHCP range invalid
// IP-invalid IP"), and a bed guest waited for a lease it never got (the
// emulator then gave such a NIC no address, where a node gives .2).
func TestBedNetworkWithoutDHCP(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := newBedEnv(t, ctx, nil)
	off := false
	sb, err := e.c.Create(ctx, apitype.CreateRequest{
		Networks: []apitype.NetworkRequest{{Name: "nodhcp", DHCP: &off}, {Name: "lan"}},
		VMs: []apitype.VMRequest{
			{Template: "debian", Networks: []string{"nodhcp"}},
			{Template: "debian", Networks: []string{"lan"}},
		},
	})
	if err != nil {
		t.Fatalf("create with a dhcp:false network: %v", err)
	}
	if len(sb.Networks) != 2 || sb.Networks[0].DHCP || !sb.Networks[1].DHCP {
		t.Fatalf("networks %+v, want nodhcp without DHCP and lan with it", sb.Networks)
	}
	// The zone's dnsmasq serves lan's range and nodhcp's subnet as a
	// static range (only mapped addresses).
	nodhcp := netip.MustParsePrefix(sb.Networks[0].CIDR)
	ranges := dnsmasqRanges(t, e, sb.Zone)
	static := fmt.Sprintf("--dhcp-range=set:%s,%s,static,", sb.Networks[0].VNet, nodhcp.Addr())
	if len(ranges) != 2 || !strings.HasPrefix(ranges[0], static) && !strings.HasPrefix(ranges[1], static) ||
		!strings.Contains(ranges[0]+ranges[1], "set:"+sb.Networks[1].VNet+",") {
		t.Errorf("dnsmasq dhcp ranges %q, want lan's and %s's static one", ranges, sb.Networks[0].VNet)
	}
	want := nodhcp.Addr().Next().Next().String() // .2: the gateway holds .1
	if a := sb.VMs[0].Addresses; len(a) != 1 || a[0].Network != "nodhcp" || a[0].IPv4 != want {
		t.Errorf("%s's addresses %+v, want %s on nodhcp", sb.VMs[0].Name, a, want)
	}
	for i, vm := range []string{sb.VMs[0].Name, sb.VMs[1].Name} {
		res, err := e.c.Exec(ctx, sb.ID, vm, apitype.ExecRequest{Argv: []string{"ip", "-4", "-o", "addr", "show", "dev", "eth0"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec on %s: %+v %v", vm, res, err)
		}
		if !strings.Contains(string(res.Stdout), " inet ") {
			t.Errorf("%s has no IPv4 address: %q", vm, res.Stdout)
		}
		if i == 0 && !strings.Contains(string(res.Stdout), " inet "+want+"/") {
			t.Errorf("%s's address %q, want %s by DHCP", vm, res.Stdout, want)
		}
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	vms, err := e.px.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vms {
		if !v.Template {
			t.Errorf("VM left: %+v", v)
		}
	}
	if vnets, err := e.px.ListVNets(ctx); err != nil || len(vnets) != 0 {
		t.Errorf("vnets left: %+v %v", vnets, err)
	}
	if cidrs, err := e.px.ListSubnetCIDRs(ctx); err != nil || len(cidrs) != 0 {
		t.Errorf("subnets left: %q %v", cidrs, err)
	}
	for _, v := range sb.VMs {
		if _, ok := e.bed.Guest(v.VMID); ok {
			t.Errorf("guest %d still running on the bed", v.VMID)
		}
	}
	for _, n := range sb.Networks {
		if err := e.bed.Command(ctx, e.bed.NodeNS(), "ip", "link", "show", n.VNet).Run(); err == nil {
			t.Errorf("bridge %s left on the node", n.VNet)
		}
	}
	if pid := e.bed.DnsmasqPID(sb.Zone); pid != 0 {
		t.Errorf("zone %s dnsmasq left (pid %d)", sb.Zone, pid)
	}
	if v := e.emu.Violations(); len(v) != 0 {
		t.Errorf("schema violations: %+v", v)
	}
}

// dnsmasqRanges are the --dhcp-range arguments of zone's dnsmasq on the
// bed, in order.
func dnsmasqRanges(t *testing.T, e *bedEnv, zone string) []string {
	t.Helper()
	conf, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(e.bed.DnsmasqPID(zone)), "cmdline"))
	if err != nil {
		t.Fatalf("zone %s dnsmasq: %v", zone, err)
	}
	var out []string
	for _, a := range strings.Split(string(conf), "\x00") {
		if strings.HasPrefix(a, "--dhcp-range=") {
			out = append(out, a)
		}
	}
	return out
}
