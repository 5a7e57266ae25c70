package sandboxapi

import (
	"fmt"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestNetworkRoom: a create whose NICs need more addresses than their
// network gives them while configured is refused at the network's cidr
// before anything is made, as checkRangeRoom refuses dhcp_ranges too
// small, not left to fail in Proxmox's configure ("can't find free ip in
// subnet").
//
// A network of dhcp off is a subnet without a dhcp-range, whose NICs
// Proxmox gives, when each is configured, the next free address of the
// whole prefix (pve-network PVEPlugin.pm add_next_freeip: from the
// network address plus one to NetAddr::IP's last, the broadcast address
// less one, the gateway held), a NIC with a fixed ipv4 too, whose fixed
// address is held besides (sandbox/fixed.go, step 2), and the sandbox's
// VMs build side by side: a /28 holds 13 (review 51a).
//
// A network with DHCP, a fixed cidr and no dhcp_ranges gets the daemon's
// range of the cidr (sandbox.PlanDHCPRange: a /28's .2-.14, a /24's
// .10-.254), taken as ranges of the request's are: a fixed ipv4 inside
// it is not free.
func TestNetworkRoom(t *testing.T) {
	vms := func(net string, fixed, plain int) []apitype.VMRequest {
		var out []apitype.VMRequest
		for i := range fixed {
			out = append(out, apitype.VMRequest{Template: "debian", NICs: []apitype.NIC{{Network: net, IPv4: fmt.Sprintf("10.21.0.%d", 2+i)}}})
		}
		for range plain {
			out = append(out, apitype.VMRequest{Template: "debian", Networks: []string{net}})
		}
		for i := range out {
			out[i].Name = fmt.Sprintf("v%d", i)
		}
		return out
	}
	for _, tc := range []struct {
		name         string
		dhcp         bool
		cidr         string
		fixed, plain int
		field        string
	}{
		{"dhcp off: a /28's 13 addresses, one a NIC", false, "10.21.0.0/28", 0, 13, ""},
		{"dhcp off: a /28 and 14 NICs", false, "10.21.0.0/28", 0, 14, "networks[0].cidr"},
		{"dhcp off: six fixed NICs and one more in a /28", false, "10.21.0.0/28", 6, 1, ""},
		{"dhcp off: seven fixed NICs in a /28, two addresses each while configured", false, "10.21.0.0/28", 7, 0, "networks[0].cidr"},
		{"dhcp off: seven fixed NICs in a /24", false, "10.21.0.0/24", 7, 0, ""},
		{"the plan's range: a /28's 13 addresses, 13 NICs", true, "10.21.0.0/28", 0, 13, ""},
		{"the plan's range: a /28 and 14 NICs", true, "10.21.0.0/28", 0, 14, "networks[0].cidr"},
		{"the plan's range: seven fixed NICs inside a /28's", true, "10.21.0.0/28", 7, 0, "networks[0].cidr"},
		{"the plan's range: six fixed NICs inside a /28's", true, "10.21.0.0/28", 6, 0, ""},
		// .2-.8 are below a /24's range (.10-.254): they take none of it
		{"the plan's range: seven fixed NICs below a /24's", true, "10.21.0.0/24", 7, 0, ""},
		{"the plan's range: auto, its prefix the daemon's", true, "auto", 0, 14, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dhcp := tc.dhcp
			c := apitype.CreateRequest{VMs: vms("lan", tc.fixed, tc.plain), Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: tc.cidr, DHCP: &dhcp}}}
			refusedAt(t, validateCreate(&c, 3600, 86400), tc.field)
		})
	}
}
