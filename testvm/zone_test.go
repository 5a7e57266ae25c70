package testvm

import (
	"net/netip"
	"strings"
	"testing"
)

// TestVNetValidateDHCP: a vnet without a DHCP range is valid (a Proxmox
// subnet's dhcp-range is optional), with or without the static range a
// DHCP zone serves it by; so are several ranges; a range half given,
// outside the subnet or reversed is not, first or later, nor ranges with
// the static range. A MAC gets a lease on a vnet with ranges, mapped to
// an address or not, and on a vnet of the static range only when mapped
// to an address (dnsmasq's static range hands out only dhcp-host ones).
func TestVNetValidateDHCP(t *testing.T) {
	a := netip.MustParseAddr
	ok := DHCPRange{Start: a("10.10.1.100"), End: a("10.10.1.200")}
	for _, tc := range []struct {
		name   string
		ranges []DHCPRange
		static bool
		err    string
	}{
		{"no DHCP", nil, false, ""},
		{"static range", nil, true, ""},
		{"range", []DHCPRange{ok}, false, ""},
		{"two ranges", []DHCPRange{ok, {Start: a("10.10.1.20"), End: a("10.10.1.20")}}, false, ""},
		{"start only", []DHCPRange{{Start: a("10.10.1.100")}}, false, "bad DHCP range"},
		{"end only", []DHCPRange{{End: a("10.10.1.200")}}, false, "bad DHCP range"},
		{"outside", []DHCPRange{{Start: a("10.10.2.100"), End: a("10.10.2.200")}}, false, "bad DHCP range"},
		{"reversed", []DHCPRange{{Start: a("10.10.1.200"), End: a("10.10.1.100")}}, false, "bad DHCP range"},
		{"a later range reversed", []DHCPRange{ok, {Start: a("10.10.1.50"), End: a("10.10.1.40")}}, false, "bad DHCP range 10.10.1.50-10.10.1.40"},
		{"a range and the static range", []DHCPRange{ok}, true, "a static DHCP range and ranges"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := VNet{Name: "vneta", Subnet: netip.MustParsePrefix("10.10.1.0/24"), Gateway: a("10.10.1.1"), DHCP: tc.ranges, StaticDHCP: tc.static}
			err := v.validate()
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("validate: %v, want %q", err, tc.err)
			}
			if got, want := v.HasDHCP(), len(tc.ranges) > 0; got != want {
				t.Errorf("HasDHCP %v, want %v", got, want)
			}
			if tc.err != "" {
				return
			}
			mapped, unmapped := v.leases(a("10.10.1.2")), v.leases(netip.Addr{})
			if want := len(tc.ranges) > 0 || tc.static; mapped != want {
				t.Errorf("lease for a MAC mapped to an address %v, want %v", mapped, want)
			}
			if want := len(tc.ranges) > 0; unmapped != want {
				t.Errorf("lease for a MAC mapped to none %v, want %v", unmapped, want)
			}
		})
	}
}
