package e2e_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestEmulatorDHCPRanges: a sandbox whose network gives dhcp_ranges (the
// reference README's .50-.100 and a one-address range before it in the
// request's order) gets a subnet of exactly those dhcp-range entries, in
// that order; a VM's address comes from the ranges, a fixed address
// outside them is the NIC's, and a network without ranges keeps the
// plan's range.
func TestEmulatorDHCPRanges(t *testing.T) {
	e := newEmuEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ranges := []apitype.DHCPRange{{Start: "192.168.20.200", End: "192.168.20.200"}, {Start: "192.168.20.50", End: "192.168.20.100"}}
	sb, err := e.c.Create(ctx, apitype.CreateRequest{
		Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "192.168.20.0/24", DHCPRanges: ranges}, {Name: "wan", CIDR: "10.66.0.0/24"}},
		VMs: []apitype.VMRequest{
			{Name: "a", Template: "debian", Networks: []string{"lan", "wan"}},
			{Name: "b", Template: "debian", NICs: []apitype.NIC{{Network: "lan", IPv4: "192.168.20.5"}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.66.0.0/24 10.66.0.10-10.66.0.254", "192.168.20.0/24 192.168.20.200-192.168.20.200,192.168.20.50-192.168.20.100"}
	if got := e.emu.SubnetDHCPRanges(sb.ID); !slices.Equal(got, want) {
		t.Errorf("the zone's subnets %q, want %q", got, want)
	}
	if !slices.Equal(sb.Networks[0].DHCPRanges, ranges) {
		t.Errorf("lan's ranges in the answer %+v, want %+v", sb.Networks[0].DHCPRanges, ranges)
	}
	a, b := sb.VMs[0], sb.VMs[1]
	if len(a.Addresses) != 2 || a.Addresses[0].Network != "lan" || !inDHCPRanges(ranges, a.Addresses[0].IPv4) {
		t.Errorf("a's addresses %+v, want lan's inside %+v", a.Addresses, ranges)
	}
	if !slices.Equal(b.Addresses, []apitype.VMAddress{{Network: "lan", IPv4: "192.168.20.5"}}) {
		t.Errorf("b's addresses %+v, want its fixed 192.168.20.5", b.Addresses)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t, ctx)
}

// inDHCPRanges reports whether address s lies in one of rs.
func inDHCPRanges(rs []apitype.DHCPRange, s string) bool {
	a := netip.MustParseAddr(s)
	return slices.ContainsFunc(rs, func(r apitype.DHCPRange) bool {
		return !a.Less(netip.MustParseAddr(r.Start)) && !netip.MustParseAddr(r.End).Less(a)
	})
}
