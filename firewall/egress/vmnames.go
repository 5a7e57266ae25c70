package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/miekg/dns"
)

// VM names: the resolver answers the names of a sandbox's VMs to that
// sandbox's own guests, in every mode, itself (not the zone's dnsmasq,
// not upstream), so that siblings find each other by DNS as they do
// through the managed block of /etc/hosts (package sandbox).
//
// Design decisions:
//
//   - The names are the engine's (the API's VM names) with the addresses
//     of Proxmox's IPAM, handed over by the engine (Registry.SetNames)
//     when it writes the guests' /etc/hosts: a cold create before the
//     sandbox is ready, a pool claim after the claim's Begin. Nothing a
//     guest says (its DHCP host name, its lease) names a VM here.
//   - They belong to one instance of the zone: SetNames keeps, per
//     bridge, the generation the instance began at, and a question is
//     answered only while the asking interface's instance is that one
//     (the one the question was decided under). Begin (a claim, a new
//     sandbox on the zone), Remove (the delete) and a Set that hands the
//     zone to another owner drop them, so no later tenant of the zone,
//     its bridges or its addresses ever sees them.
//   - Only the asking interface's own zone's names are looked up: the
//     interface is the one the question came in on (IP_PKTINFO, the
//     TCP socket's local address), never the guest's source address, so a
//     guest cannot ask as another sandbox.
//   - A name is a VM name (one DNS label) as asked, any case, with or
//     without the trailing dot, bare or under the zone's DNS domain
//     (ResolverConfig.Domain, [egress] zone_domain). The answer is the
//     VM's addresses on the asking interface's bridge (the network they
//     share), else its first address (as /etc/hosts names it); A gets the
//     IPv4 ones, AAAA the IPv6 ones (none today: NOERROR, no data), every
//     other type NOERROR with no data; authoritative, with TTL
//     vmNameTTL. A name of no VM of the sandbox takes the path it took
//     before (the zone's dnsmasq in open mode, the allow-list, NXDOMAIN).

// NameAddr is one address a VM's name resolves to: Addr, on the guest
// bridge (vnet) Bridge.
type NameAddr struct {
	Bridge string
	Addr   netip.Addr
}

const (
	// MaxVMNames bounds the names one SetNames hands over; MaxNameAddrs
	// the addresses of one name.
	MaxVMNames   = 256
	MaxNameAddrs = 16
	// vmNameTTL is the TTL of an answered VM name (seconds): the
	// addresses stay for the instance's life.
	vmNameTTL = 60
)

// ErrNotOwner is returned by SetNames for a zone without a policy of the
// owner's own.
var ErrNotOwner = errors.New("zone has no policy of this owner")

// vmNames are the VM names of one instance of a zone (SetNames).
type vmNames struct {
	began map[string]uint64     // bridge -> the generation its instance began at, when set
	hosts map[string][]NameAddr // lower-case VM name -> its addresses, in the engine's order
}

// SetNames hands the resolver the VM names of owner's zone (the names
// of its current instance, replacing what an earlier SetNames of the
// instance gave): each name (a DNS label, any case) with its addresses,
// each on one of the zone's bridges. It refuses a zone whose policy is
// not owner's (ErrNotOwner), a bad name or address, and more than
// MaxVMNames names or MaxNameAddrs addresses of one. The names go with
// the instance: Begin, Remove, a Set for another owner.
func (r *Registry) SetNames(zone, owner string, names map[string][]NameAddr) error {
	if len(names) > MaxVMNames {
		return fmt.Errorf("names of %s: %d names, at most %d", owner, len(names), MaxVMNames)
	}
	hosts := make(map[string][]NameAddr, len(names))
	for n, addrs := range names {
		h := strings.ToLower(n)
		if strings.Contains(h, ".") || checkName(h) != nil {
			return fmt.Errorf("names of %s: %q is no DNS label", owner, n)
		}
		if _, dup := hosts[h]; dup {
			return fmt.Errorf("names of %s: %q twice", owner, h)
		}
		if len(addrs) > MaxNameAddrs {
			return fmt.Errorf("names of %s: %s has %d addresses, at most %d", owner, h, len(addrs), MaxNameAddrs)
		}
		out := make([]NameAddr, 0, len(addrs))
		for _, a := range addrs {
			ip := a.Addr.Unmap()
			if !ip.IsValid() || ip.IsUnspecified() || ip.Zone() != "" {
				return fmt.Errorf("names of %s: %s: bad address %v", owner, h, a.Addr)
			}
			out = append(out, NameAddr{Bridge: a.Bridge, Addr: ip})
		}
		hosts[h] = out
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.zones[zone]
	if !ok || e.owner != owner {
		return fmt.Errorf("names of %s: zone %s: %w", owner, zone, ErrNotOwner)
	}
	for h, addrs := range hosts {
		for _, a := range addrs {
			if !slices.Contains(e.bridges, a.Bridge) {
				return fmt.Errorf("names of %s: %s: bridge %q is not one of zone %s's", owner, h, a.Bridge, zone)
			}
		}
	}
	began := make(map[string]uint64, len(e.bridges))
	for _, b := range e.bridges {
		began[b] = r.began[b]
	}
	r.names[zone] = vmNames{began: began, hosts: hosts}
	return nil
}

// vmName returns the addresses VM name host (lower case) of zone has as
// seen from guest interface iface, if iface is zone's and its instance
// is still the one begun at generation began, the one the names were
// handed over for.
func (r *Registry) vmName(iface, zone string, began uint64, host string) ([]netip.Addr, bool) {
	if began == 0 {
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.zones[zone]
	if !ok || !slices.Contains(e.bridges, iface) || r.began[iface] != began {
		return nil, false
	}
	n, ok := r.names[zone]
	if !ok || n.began[iface] != began {
		return nil, false
	}
	addrs, ok := n.hosts[host]
	if !ok {
		return nil, false
	}
	var out []netip.Addr
	for _, a := range addrs {
		if a.Bridge == iface {
			out = append(out, a.Addr)
		}
	}
	if len(out) == 0 && len(addrs) > 0 {
		out = append(out, addrs[0].Addr)
	}
	return out, true
}

// vmHost is the VM name qname asks for (lower case; "" for none): a
// single label, bare or under domain (lower case, no trailing dot; ""
// for none).
func vmHost(qname, domain string) string {
	n := strings.ToLower(strings.TrimSuffix(qname, "."))
	if domain != "" {
		n = strings.TrimSuffix(n, "."+domain)
	}
	if n == "" || strings.Contains(n, ".") || checkName(n) != nil {
		return ""
	}
	return n
}

// sandboxName returns the addresses of the VM of iface's sandbox that
// qname names, if it names one, for a question decided under the
// instance begun at began.
func (r *Resolver) sandboxName(iface string, began uint64, qname string) ([]netip.Addr, bool) {
	if began == 0 {
		return nil, false
	}
	zone, ok := r.reg.ZoneOf(iface)
	if !ok {
		return nil, false
	}
	dom := ""
	if r.cfg.Domain != nil {
		dom = strings.ToLower(strings.TrimSuffix(r.cfg.Domain(zone), "."))
	}
	host := vmHost(qname, dom)
	if host == "" {
		return nil, false
	}
	return r.reg.vmName(iface, zone, began, host)
}

// nameRecords are the records of addrs that answer question qn: A
// records of the IPv4 addresses for A, AAAA of the IPv6 ones for AAAA,
// none for any other type.
func nameRecords(qn dns.Question, addrs []netip.Addr) []dns.RR {
	var out []dns.RR
	for _, a := range addrs {
		switch {
		case qn.Qtype == dns.TypeA && a.Is4():
			out = append(out, &dns.A{Hdr: dns.RR_Header{Name: qn.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: vmNameTTL}, A: a.AsSlice()})
		case qn.Qtype == dns.TypeAAAA && a.Is6():
			out = append(out, &dns.AAAA{Hdr: dns.RR_Header{Name: qn.Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: vmNameTTL}, AAAA: a.AsSlice()})
		}
	}
	return out
}
