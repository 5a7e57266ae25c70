package main

import (
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestNetworkColumn: the list's NETWORKS entry of a network shows its
// DHCP ranges in order, and nothing of DHCP for a network without.
func TestNetworkColumn(t *testing.T) {
	for _, tc := range []struct {
		n    apitype.Network
		want string
	}{
		{apitype.Network{Name: "dark", CIDR: "10.8.0.0/24"}, "dark=10.8.0.0/24"},
		{apitype.Network{Name: "lan", CIDR: "192.168.20.0/24", DHCP: true, DHCPRanges: []apitype.DHCPRange{
			{Start: "192.168.20.200", End: "192.168.20.210"}, {Start: "192.168.20.50", End: "192.168.20.100"}}},
			"lan=192.168.20.0/24[192.168.20.200-192.168.20.210;192.168.20.50-192.168.20.100]"},
	} {
		if got := networkColumn(tc.n); got != tc.want {
			t.Errorf("networkColumn(%+v) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
