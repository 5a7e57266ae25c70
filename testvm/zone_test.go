package testvm

import (
	"net/netip"
	"strings"
	"testing"
)

// TestVNetValidateDHCP: a vnet without a DHCP range is valid (a Proxmox
// subnet's dhcp-range is optional); a range half given, outside the
// subnet or reversed is not.
func TestVNetValidateDHCP(t *testing.T) {
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name       string
		start, end netip.Addr
		err        string
	}{
		{"no DHCP", netip.Addr{}, netip.Addr{}, ""},
		{"range", a("10.10.1.100"), a("10.10.1.200"), ""},
		{"start only", a("10.10.1.100"), netip.Addr{}, "bad DHCP range"},
		{"end only", netip.Addr{}, a("10.10.1.200"), "bad DHCP range"},
		{"outside", a("10.10.2.100"), a("10.10.2.200"), "bad DHCP range"},
		{"reversed", a("10.10.1.200"), a("10.10.1.100"), "bad DHCP range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := VNet{Name: "vneta", Subnet: netip.MustParsePrefix("10.10.1.0/24"), Gateway: a("10.10.1.1"), DHCPStart: tc.start, DHCPEnd: tc.end}
			err := v.validate()
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("validate: %v, want %q", err, tc.err)
			}
			if got, want := v.HasDHCP(), tc.start.IsValid() || tc.end.IsValid(); got != want {
				t.Errorf("HasDHCP %v, want %v", got, want)
			}
		})
	}
}
