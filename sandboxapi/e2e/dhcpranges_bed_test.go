package e2e_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestBedDHCPRanges is issue 37's dhcp_ranges on the bed: on a network of
// two ranges (a one-address range first, then .50-.60) a VM's DHCP lease,
// on its eth0 and in the API, lies inside a range, and a VM with a fixed
// address outside the ranges has that one; the zone's dnsmasq has one
// --dhcp-range per range.
func TestBedDHCPRanges(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := newBedEnv(t, ctx, nil)
	ranges := []apitype.DHCPRange{{Start: "10.81.0.200", End: "10.81.0.200"}, {Start: "10.81.0.50", End: "10.81.0.60"}}
	sb, err := e.c.Create(ctx, apitype.CreateRequest{
		Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "10.81.0.0/24", DHCPRanges: ranges}},
		VMs: []apitype.VMRequest{
			{Name: "web", Template: "debian", NICs: []apitype.NIC{{Network: "lan", IPv4: "10.81.0.5"}}},
			{Name: "cli", Template: "debian", Networks: []string{"lan"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.Background(), sb.ID) })
	// the zone's dnsmasq has one --dhcp-range per range, in order
	got := dnsmasqRanges(t, e, sb.Zone)
	vn := sb.Networks[0].VNet
	want := []string{"--dhcp-range=set:" + vn + ",10.81.0.200,10.81.0.200,255.255.255.0,1h", "--dhcp-range=set:" + vn + ",10.81.0.50,10.81.0.60,255.255.255.0,1h"}
	if !slices.Equal(got, want) {
		t.Errorf("dnsmasq ranges %q, want %q", got, want)
	}
	for _, v := range sb.VMs {
		if len(v.Addresses) != 1 {
			t.Errorf("%s: addresses %+v, want one", v.Name, v.Addresses)
			continue
		}
		got := netip.MustParseAddr(v.Addresses[0].IPv4)
		if v.Name == "web" && got.String() != "10.81.0.5" || v.Name == "cli" && !inDHCPRanges(ranges, got.String()) {
			t.Errorf("%s: address %s, want %s", v.Name, got, map[string]string{"web": "10.81.0.5", "cli": "one of the ranges"}[v.Name])
		}
		res, err := e.c.Exec(ctx, sb.ID, v.Name, apitype.ExecRequest{Argv: []string{"ip", "-4", "-o", "addr", "show", "dev", "eth0"}, TimeoutSeconds: 20})
		if err != nil {
			t.Fatal(err)
		}
		if out := string(res.Stdout); res.ExitCode != 0 || !strings.Contains(out, " "+got.String()+"/24 ") {
			t.Errorf("%s: eth0 %q (exit %d), want its lease %s", v.Name, out, res.ExitCode, got)
		}
	}
}
