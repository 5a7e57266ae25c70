package e2e_test

import (
	"context"
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
// guests are up without an address by DHCP and exec works, and the delete
// leaves no VM, vnet, bridge or dnsmasq behind. schemathesis found such a
// create answered 502: the bed's SDN apply refused a vnet without a DHCP
// range ("bad DHCP range invalid IP-invalid IP"), and a bed guest waited
// for a lease it never gets.
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
	// The zone's dnsmasq runs (DNS) with a DHCP range for lan only.
	ranges := dnsmasqRanges(t, e, sb.Zone)
	for _, a := range ranges {
		if !strings.Contains(a, "set:"+sb.Networks[1].VNet+",") {
			t.Errorf("dhcp range %q, want only %s's", a, sb.Networks[1].VNet)
		}
	}
	if len(ranges) != 1 {
		t.Errorf("dnsmasq has %d dhcp ranges, want 1: %q", len(ranges), ranges)
	}
	for i, want := range []bool{false, true} {
		vm := sb.VMs[i].Name
		res, err := e.c.Exec(ctx, sb.ID, vm, apitype.ExecRequest{Argv: []string{"ip", "-4", "-o", "addr", "show", "dev", "eth0"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec on %s: %+v %v", vm, res, err)
		}
		if got := strings.Contains(string(res.Stdout), " inet "); got != want {
			t.Errorf("%s has an IPv4 address %v, want %v: %q", vm, got, want, res.Stdout)
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
