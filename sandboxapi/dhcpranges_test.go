package sandboxapi

import (
	"fmt"
	"slices"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestValidateDHCPRanges: a network's dhcp_ranges as the create validator
// takes them: what Proxmox refuses (start above end, outside the subnet,
// overlapping: SubnetPlugin.pm validate_dhcp_ranges) and what the daemon
// refuses besides (network, broadcast and gateway addresses, an "auto"
// cidr, dhcp off, more than four, not IPv4, ranges without room for the
// network's NICs), each at its own field; accepted ranges keep their order.
func TestValidateDHCPRanges(t *testing.T) {
	off, on := false, true
	r := func(a, b string) apitype.DHCPRange { return apitype.DHCPRange{Start: a, End: b} }
	lan := func(rs ...apitype.DHCPRange) apitype.NetworkRequest {
		return apitype.NetworkRequest{Name: "lan", CIDR: "192.168.20.0/24", DHCPRanges: rs}
	}
	one := []apitype.VMRequest{{Template: "debian", Networks: []string{"lan"}}}
	for _, tc := range []struct {
		name  string
		net   apitype.NetworkRequest
		vms   []apitype.VMRequest
		field string // "" accepted
	}{
		{"the reference README's range", lan(r("192.168.20.50", "192.168.20.100")), one, ""},
		{"several, in any order, one address each end", lan(r("192.168.20.200", "192.168.20.254"), r("192.168.20.2", "192.168.20.2"), r("192.168.20.3", "192.168.20.9")), one, ""},
		{"four", lan(r("192.168.20.10", "192.168.20.10"), r("192.168.20.11", "192.168.20.11"), r("192.168.20.12", "192.168.20.12"), r("192.168.20.13", "192.168.20.13")), one, ""},
		{"dhcp on written out", apitype.NetworkRequest{Name: "lan", CIDR: "192.168.20.0/24", DHCP: &on, DHCPRanges: []apitype.DHCPRange{r("192.168.20.50", "192.168.20.60")}}, one, ""},
		{"five", lan(r("192.168.20.10", "192.168.20.10"), r("192.168.20.11", "192.168.20.11"), r("192.168.20.12", "192.168.20.12"), r("192.168.20.13", "192.168.20.13"), r("192.168.20.14", "192.168.20.14")), one, "networks[0].dhcp_ranges"},
		{"auto cidr", apitype.NetworkRequest{Name: "lan", DHCPRanges: []apitype.DHCPRange{r("10.0.0.50", "10.0.0.60")}}, one, "networks[0].dhcp_ranges"},
		{"dhcp off", apitype.NetworkRequest{Name: "lan", CIDR: "192.168.20.0/24", DHCP: &off, DHCPRanges: []apitype.DHCPRange{r("192.168.20.50", "192.168.20.60")}}, one, "networks[0].dhcp_ranges"},
		{"start not an address", lan(r("192.168.20.x", "192.168.20.60")), one, "networks[0].dhcp_ranges[0].start"},
		{"start with a leading zero", lan(r("192.168.20.050", "192.168.20.60")), one, "networks[0].dhcp_ranges[0].start"},
		{"end IPv6", lan(r("192.168.20.50", "::ffff:192.168.20.60")), one, "networks[0].dhcp_ranges[0].end"},
		{"end outside the cidr", lan(r("192.168.20.50", "192.168.21.60")), one, "networks[0].dhcp_ranges[0].end"},
		{"start the network address", lan(r("192.168.20.0", "192.168.20.60")), one, "networks[0].dhcp_ranges[0].start"},
		{"start the gateway", lan(r("192.168.20.1", "192.168.20.60")), one, "networks[0].dhcp_ranges[0].start"},
		{"end the broadcast address", lan(r("192.168.20.50", "192.168.20.255")), one, "networks[0].dhcp_ranges[0].end"},
		{"start above end", lan(r("192.168.20.60", "192.168.20.50")), one, "networks[0].dhcp_ranges[0]"},
		{"overlapping", lan(r("192.168.20.50", "192.168.20.100"), r("192.168.20.10", "192.168.20.49"), r("192.168.20.90", "192.168.20.120")), one, "networks[0].dhcp_ranges[2]"},
		{"sharing one address", lan(r("192.168.20.50", "192.168.20.100"), r("192.168.20.100", "192.168.20.110")), one, "networks[0].dhcp_ranges[1]"},
		{"room for every NIC", lan(r("192.168.20.50", "192.168.20.51")), []apitype.VMRequest{
			{Template: "debian", Networks: []string{"lan"}}, {Template: "debian", NICs: []apitype.NIC{{Network: "lan", IPv4: "192.168.20.200"}}},
		}, ""},
		{"one NIC too many", lan(r("192.168.20.50", "192.168.20.51")), []apitype.VMRequest{
			{Template: "debian", Networks: []string{"lan", "lan"}}, {Template: "debian", NICs: []apitype.NIC{{Network: "lan", IPv4: "192.168.20.200"}}},
		}, "networks[0].dhcp_ranges"},
		{"a fixed address inside takes room", lan(r("192.168.20.50", "192.168.20.51")), []apitype.VMRequest{
			{Template: "debian", Networks: []string{"lan"}}, {Template: "debian", NICs: []apitype.NIC{{Network: "lan", IPv4: "192.168.20.51"}}},
		}, "networks[0].dhcp_ranges"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := apitype.CreateRequest{VMs: slices.Clone(tc.vms), Networks: []apitype.NetworkRequest{tc.net}}
			for i := range c.VMs {
				c.VMs[i].Name = fmt.Sprintf("v%d", i)
				c.VMs[i].NICs = slices.Clone(c.VMs[i].NICs)
			}
			want := slices.Clone(tc.net.DHCPRanges)
			if refusedAt(t, validateCreate(&c, 3600, 86400), tc.field) {
				return
			}
			if !slices.Equal(c.Networks[0].DHCPRanges, want) {
				t.Errorf("ranges %v, want %v as given", c.Networks[0].DHCPRanges, want)
			}
		})
	}
}
