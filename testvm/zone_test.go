package testvm

import (
	"net/netip"
	"strings"
	"testing"
)

// TestVNetValidateDHCP: a vnet without a DHCP range is valid (a Proxmox
// subnet's dhcp-range is optional); so are several ranges; a range half
// given, outside the subnet or reversed is not, first or later.
func TestVNetValidateDHCP(t *testing.T) {
	a := netip.MustParseAddr
	ok := DHCPRange{Start: a("10.10.1.100"), End: a("10.10.1.200")}
	for _, tc := range []struct {
		name   string
		ranges []DHCPRange
		err    string
	}{
		{"no DHCP", nil, ""},
		{"range", []DHCPRange{ok}, ""},
		{"two ranges", []DHCPRange{ok, {Start: a("10.10.1.20"), End: a("10.10.1.20")}}, ""},
		{"start only", []DHCPRange{{Start: a("10.10.1.100")}}, "bad DHCP range"},
		{"end only", []DHCPRange{{End: a("10.10.1.200")}}, "bad DHCP range"},
		{"outside", []DHCPRange{{Start: a("10.10.2.100"), End: a("10.10.2.200")}}, "bad DHCP range"},
		{"reversed", []DHCPRange{{Start: a("10.10.1.200"), End: a("10.10.1.100")}}, "bad DHCP range"},
		{"a later range reversed", []DHCPRange{ok, {Start: a("10.10.1.50"), End: a("10.10.1.40")}}, "bad DHCP range 10.10.1.50-10.10.1.40"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := VNet{Name: "vneta", Subnet: netip.MustParsePrefix("10.10.1.0/24"), Gateway: a("10.10.1.1"), DHCP: tc.ranges}
			err := v.validate()
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("validate: %v, want %q", err, tc.err)
			}
			if got, want := v.HasDHCP(), len(tc.ranges) > 0; got != want {
				t.Errorf("HasDHCP %v, want %v", got, want)
			}
		})
	}
}
