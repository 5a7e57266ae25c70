package sandboxapi_test

import (
	"errors"
	"net/http"
	"slices"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestCreateDHCPRanges: a create whose network's dhcp_ranges are refused
// gets a 400 naming the field and makes nothing in Proxmox; one whose
// ranges are taken answers them in its network, in the request's order,
// and a network without ranges answers its plan's.
func TestCreateDHCPRanges(t *testing.T) {
	e := newEnv(t, nil)
	ranges := []apitype.DHCPRange{{Start: "192.168.20.200", End: "192.168.20.210"}, {Start: "192.168.20.50", End: "192.168.20.100"}}
	bad := apitype.CreateRequest{
		Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "192.168.20.0/24", DHCPRanges: []apitype.DHCPRange{ranges[1], {Start: "192.168.20.90", End: "192.168.20.95"}}}},
		VMs:      []apitype.VMRequest{{Template: "debian", Networks: []string{"lan"}}},
	}
	before := e.px.Mutations()
	_, err := e.c.Create(e.ctx(), bad)
	var p *apitype.Problem
	if !errors.As(err, &p) || p.Status != http.StatusBadRequest || p.Field != "networks[0].dhcp_ranges[1]" {
		t.Fatalf("overlapping ranges: %v, want a 400 of networks[0].dhcp_ranges[1]", err)
	}
	if n := e.px.Mutations(); n != before {
		t.Fatalf("a refused create changed Proxmox (mutations %d -> %d)", before, n)
	}
	good := bad
	good.Networks = []apitype.NetworkRequest{{Name: "lan", CIDR: "192.168.20.0/24", DHCPRanges: ranges}, {Name: "wan", CIDR: "10.61.0.0/24"}}
	good.VMs = []apitype.VMRequest{{Template: "debian", Networks: []string{"lan", "wan"}}}
	sb := e.create(good)
	if !slices.Equal(sb.Networks[0].DHCPRanges, ranges) {
		t.Errorf("lan's ranges %+v, want %+v", sb.Networks[0].DHCPRanges, ranges)
	}
	if want := []apitype.DHCPRange{{Start: "10.61.0.10", End: "10.61.0.254"}}; !slices.Equal(sb.Networks[1].DHCPRanges, want) {
		t.Errorf("wan's ranges %+v, want the plan's %+v", sb.Networks[1].DHCPRanges, want)
	}
	got, err := e.c.Get(e.ctx(), sb.ID)
	if err != nil || !slices.Equal(got.Networks[0].DHCPRanges, ranges) {
		t.Errorf("get: %v, ranges %+v", err, got.Networks)
	}
}
