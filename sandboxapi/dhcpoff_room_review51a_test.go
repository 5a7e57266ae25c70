package sandboxapi

import (
	"fmt"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestDHCPOffRoomReview51a: a network of dhcp off is a subnet without a
// dhcp-range, whose NICs Proxmox gives, when each is configured, the next
// free address of the whole prefix (pve-network PVEPlugin.pm
// add_next_freeip: from the network address plus one to NetAddr::IP's
// last, the broadcast address less one, the gateway held), a NIC with a
// fixed ipv4 too, whose fixed address is held besides (sandbox/fixed.go,
// step 2), and the sandbox's VMs build side by side. A create whose NICs
// and fixed addresses need more than the prefix has (a /28's 13) is
// refused at the network's cidr before anything is made, as
// checkRangeRoom refuses ranges too small, not left to fail in
// Proxmox's configure ("can't find free ip in subnet").
func TestDHCPOffRoomReview51a(t *testing.T) {
	off := false
	vms := func(fixed, plain int) []apitype.VMRequest {
		var out []apitype.VMRequest
		for i := range fixed {
			out = append(out, apitype.VMRequest{Template: "debian", NICs: []apitype.NIC{{Network: "dark", IPv4: fmt.Sprintf("10.21.0.%d", 2+i)}}})
		}
		for range plain {
			out = append(out, apitype.VMRequest{Template: "debian", Networks: []string{"dark"}})
		}
		for i := range out {
			out[i].Name = fmt.Sprintf("v%d", i)
		}
		return out
	}
	for _, tc := range []struct {
		name         string
		cidr         string
		fixed, plain int
		field        string
	}{
		{"a /28's 13 addresses, one a NIC", "10.21.0.0/28", 0, 13, ""},
		{"a /28 and 14 NICs", "10.21.0.0/28", 0, 14, "networks[0].cidr"},
		{"six fixed NICs and one more in a /28", "10.21.0.0/28", 6, 1, ""},
		{"seven fixed NICs in a /28, two addresses each while configured", "10.21.0.0/28", 7, 0, "networks[0].cidr"},
		{"seven fixed NICs in a /24", "10.21.0.0/24", 7, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := apitype.CreateRequest{VMs: vms(tc.fixed, tc.plain), Networks: []apitype.NetworkRequest{{Name: "dark", CIDR: tc.cidr, DHCP: &off}}}
			refusedAt(t, validateCreate(&c, 3600, 86400), tc.field)
		})
	}
}
