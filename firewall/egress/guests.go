package egress

import (
	"net/netip"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall"
)

// PortGuests implements Guests from the layer-2 guard's port map
// (firewall.Guard.Ports): the address is one the guard pins to a VM's
// port, so a guest cannot claim another's. The map is read again at most
// once a second (Ports copies it under the guard's lock).
type PortGuests struct {
	// Ports returns the guard's port map.
	Ports func() []firewall.Port

	mu   sync.Mutex // guards byIP and at
	byIP map[netip.Addr]Guest
	at   time.Time

	now func() time.Time // nil: time.Now (tests set a clock)
}

// portGuestTTL is how long PortGuests uses one read of the port map.
const portGuestTTL = time.Second

// portVMID takes the VMID out of a port name of firewall.PortNames (and
// a container's veth<vmid>i<n>).
var portVMID = regexp.MustCompile(`^(?:tap|veth)([0-9]+)i[0-9]+$|^fwpr([0-9]+)p[0-9]+$`)

// portGuestMissTTL is how old a read of the port map must be before an
// address it does not hold makes PortGuests read it again: a guest that
// started since the last read is named by its first question, while
// questions from an address no port holds cost at most one read per
// portGuestMissTTL.
const portGuestMissTTL = 10 * time.Millisecond

// GuestOf implements Guests.
func (p *PortGuests) GuestOf(a netip.Addr) (Guest, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.now != nil {
		now = p.now()
	}
	if p.byIP == nil || now.Sub(p.at) >= portGuestTTL {
		p.byIP, p.at = guestsByIP(p.Ports()), now
	}
	g, ok := p.byIP[a]
	if !ok && now.Sub(p.at) >= portGuestMissTTL {
		p.byIP, p.at = guestsByIP(p.Ports()), now
		g, ok = p.byIP[a]
	}
	return g, ok
}

// guestsByIP maps each address of the port map to the VM whose ports
// hold it. An address the ports of two VMs hold (the guard pins by port
// and address, so zones with overlapping subnets may both send from it)
// names neither: the source address alone cannot say which it was.
func guestsByIP(ports []firewall.Port) map[netip.Addr]Guest {
	out := map[netip.Addr]Guest{}
	shared := map[netip.Addr]bool{}
	for _, pt := range ports {
		m := portVMID.FindStringSubmatch(pt.Name)
		if m == nil {
			continue
		}
		vmid, err := strconv.Atoi(m[1] + m[2])
		if err != nil {
			continue
		}
		for _, a := range pt.IPv4 {
			if g, ok := out[a]; ok && g.VMID != vmid {
				shared[a] = true
			}
			out[a] = Guest{Addr: a, VMID: vmid, MAC: pt.MAC.String()}
		}
	}
	for a := range shared {
		delete(out, a)
	}
	return out
}

// guestOf names the guest at a (its address alone when gs is nil or
// does not know it).
func guestOf(gs Guests, a netip.Addr) Guest {
	if gs != nil && a.IsValid() {
		if g, ok := gs.GuestOf(a); ok {
			return g
		}
	}
	return Guest{Addr: a}
}
