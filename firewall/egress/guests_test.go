package egress

import (
	"net"
	"net/netip"
	"testing"
	"time"

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

// TestPortGuestsNewGuestNamedAtOnce: a guest whose port entered the map
// after the last read is named by its first question (the miss reads the
// map again), not a second later; an address of no port reads the map at
// most once per portGuestMissTTL.
func TestPortGuestsNewGuestNamedAtOnce(t *testing.T) {
	a := netip.MustParseAddr
	mac, _ := net.ParseMAC("bc:24:11:00:01:01")
	var ports []firewall.Port
	reads := 0
	clock := time.Unix(1000, 0)
	g := &PortGuests{Ports: func() []firewall.Port { reads++; return ports }, now: func() time.Time { return clock }}
	if _, ok := g.GuestOf(a("10.200.1.10")); ok {
		t.Fatal("an address of no port was named")
	}
	clock = clock.Add(2 * portGuestMissTTL)
	ports = []firewall.Port{{Name: "tap101i0", MAC: mac, IPv4: []netip.Addr{a("10.200.1.10")}}}
	if got, ok := g.GuestOf(a("10.200.1.10")); !ok || got.VMID != 101 {
		t.Fatalf("a guest started since the last read: %+v %v, want VM 101", got, ok)
	}
	before := reads
	for range 100 {
		g.GuestOf(a("10.200.5.10"))
	}
	if reads != before {
		t.Errorf("100 questions from an address of no port within %v of a read read the map %d times, want none", portGuestMissTTL, reads-before)
	}
	clock = clock.Add(portGuestMissTTL)
	for range 100 {
		g.GuestOf(a("10.200.5.10"))
	}
	if reads != before+1 {
		t.Errorf("100 questions from an address of no port %v after a read read the map %d times, want once", portGuestMissTTL, reads-before)
	}
}
