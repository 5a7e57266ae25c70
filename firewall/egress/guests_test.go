package egress

import (
	"net"
	"net/netip"
	"testing"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// TestPortGuests: an address the port map pins to one VM's ports names
// that VM (tap and fwpr ports of one NIC agree, a container's veth too);
// an address two VMs' ports hold (zones with overlapping subnets: the
// guard pins by port and address, so both may send from it) names none,
// whichever port comes last, so no record carries another VM's VMID and
// MAC; an address of no port, or of a port of no VM, names none.
func TestPortGuests(t *testing.T) {
	mac := func(s string) net.HardwareAddr {
		m, err := net.ParseMAC(s)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a := netip.MustParseAddr
	ports := []firewall.Port{
		{Name: "fwpr101p0", MAC: mac("bc:24:11:00:01:01"), IPv4: []netip.Addr{a("10.200.1.10")}},
		{Name: "tap101i0", MAC: mac("bc:24:11:00:01:01"), IPv4: []netip.Addr{a("10.200.1.10")}},
		{Name: "tap102i0", MAC: mac("bc:24:11:00:01:02"), IPv4: []netip.Addr{a("10.200.2.10"), a("10.77.0.5")}},
		{Name: "tap103i0", MAC: mac("bc:24:11:00:01:03"), IPv4: []netip.Addr{a("10.77.0.5")}},
		{Name: "veth104i0", MAC: mac("bc:24:11:00:01:04"), IPv4: []netip.Addr{a("10.200.4.10")}},
		{Name: "vmbr9", MAC: mac("bc:24:11:00:01:09"), IPv4: []netip.Addr{a("10.200.9.10")}},
	}
	g := &PortGuests{Ports: func() []firewall.Port { return ports }}
	cases := []struct {
		addr string
		vmid int
		mac  string
	}{
		{addr: "10.200.1.10", vmid: 101, mac: "bc:24:11:00:01:01"},
		{addr: "10.200.2.10", vmid: 102, mac: "bc:24:11:00:01:02"},
		{addr: "10.77.0.5"},
		{addr: "10.200.4.10", vmid: 104, mac: "bc:24:11:00:01:04"},
		{addr: "10.200.9.10"},
		{addr: "10.200.5.10"},
	}
	for _, tc := range cases {
		got, ok := g.GuestOf(a(tc.addr))
		if ok != (tc.vmid != 0) || got.VMID != tc.vmid || got.MAC != tc.mac {
			t.Errorf("%s: %+v %v, want VM %d MAC %q", tc.addr, got, ok, tc.vmid, tc.mac)
		}
	}
}
