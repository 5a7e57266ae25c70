package pveemu

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
)

// ipamEntry is one IP of the pve IPAM database (pve-network
// PVE/Network/SDN/Ipams/PVEPlugin.pm, /etc/pve/priv/ipam.db): a gateway,
// or a host with its MAC, VMID and hostname.
type ipamEntry struct {
	gateway  bool
	mac      string
	vmid     int
	hostname string
}

// ipamAddSubnetLocked registers a subnet and its gateway, as
// SubnetPlugin on_update_hook does on subnet create (Subnets::add_subnet,
// then the gateway through add_ip with is_gateway).
func (s *Server) ipamAddSubnetLocked(zone, cidr, gateway string) {
	if s.sdn.pending.zones[zone]["ipam"] != "pve" {
		return
	}
	if s.ipam[zone] == nil {
		s.ipam[zone] = map[string]map[string]*ipamEntry{}
	}
	if s.ipam[zone][cidr] == nil {
		s.ipam[zone][cidr] = map[string]*ipamEntry{}
	}
	if gateway != "" {
		s.ipam[zone][cidr][gateway] = &ipamEntry{gateway: true}
	}
}

// ipamDelSubnetLocked is PVEPlugin del_subnet: refused while any entry but
// the gateway remains.
func (s *Server) ipamDelSubnetLocked(zone, cidr string) error {
	if s.ipam[zone] == nil || s.ipam[zone][cidr] == nil {
		return nil
	}
	ips := s.ipam[zone][cidr]
	for _, e := range ips {
		if !e.gateway {
			return fail("cannot delete subnet '%s', not empty", cidr)
		}
	}
	delete(s.ipam[zone], cidr)
	return nil
}

// vnetSubnetLocked finds the running subnet of vnet holding ip
// (Vnets::get_subnet_from_vnet_ip with Subnets::find_ip_subnet).
func (s *Server) vnetSubnetLocked(vnet string, ip netip.Addr) (zone, cidr string, sn map[string]string, err error) {
	v := s.sdn.pending.vnets[vnet]
	if v == nil {
		return "", "", nil, fail("vnet %s doesn't exist", vnet)
	}
	for _, id := range sortedKeys(s.sdn.running.subnets) {
		c := s.sdn.running.subnets[id]
		if c["vnet"] != vnet {
			continue
		}
		if p, err := netip.ParsePrefix(c["cidr"]); err == nil && p.Contains(ip) {
			return v["zone"], c["cidr"], c, nil
		}
	}
	return "", "", nil, fail("can't find any subnet for ip %s", ip)
}

// ipamAddLocked is PVEPlugin add_ip.
func (s *Server) ipamAddLocked(zone, cidr, ip string, e *ipamEntry) error {
	if s.ipam[zone] == nil {
		return fail("zone '%s' doesn't exist in IPAM DB", zone)
	}
	db := s.ipam[zone][cidr]
	if db == nil {
		return fail("subnet '%s' doesn't exist in IPAM DB", cidr)
	}
	if db[ip] != nil {
		return fail("IP '%s' already exist", ip)
	}
	db[ip] = e
	return nil
}

// The NIC side of the pve IPAM, as pve-network's Vnets.pm and qemu-server
// call it. Proxmox keeps a cluster-wide cache of each MAC's addresses
// (sdn/mac-cache.json, keyed by the MAC string alone: pve-network
// Ipams.pm add_cache_mac_ip, del_cache_mac_ip, get_ips_from_mac), and a
// NIC's address is looked up there first: macCache models it. MACs are
// compared as the exact strings Proxmox stores (PVEPlugin.pm
// get_ips_from_mac compares with eq).

// macCacheEntry is one MAC's entry of Proxmox's MAC cache: its IPv4
// address ("" when the entry holds none: get_ips_from_mac caches a miss
// too). IPv6 is not emulated.
type macCacheEntry struct {
	ip4 string
}

// addCacheMACIPLocked is Ipams.pm add_cache_mac_ip.
func (s *Server) addCacheMACIPLocked(mac, ip string) {
	if mac == "" {
		return
	}
	s.macCache[mac] = &macCacheEntry{ip4: ip}
}

// delCacheMACIPLocked is Ipams.pm del_cache_mac_ip: the MAC's IPv4
// address goes, whichever it was, and with it the entry (it holds no
// IPv6 address here).
func (s *Server) delCacheMACIPLocked(mac string) {
	delete(s.macCache, mac)
}

// dhcpZoneLocked is the zone of vnet when it has an IPAM and DHCP, as
// Vnets.pm reads them (get_vnet and get_zone without running: the
// configuration files, applied or not); "" otherwise.
func (s *Server) dhcpZoneLocked(vnet string) string {
	v := s.sdn.pending.vnets[vnet]
	if v == nil {
		return ""
	}
	z := s.sdn.pending.zones[v["zone"]]
	if z["ipam"] != "pve" || z["dhcp"] == "" {
		return ""
	}
	return v["zone"]
}

// ipsFromMACLocked is Vnets.pm get_ips_from_mac: the cached IPv4 address
// of mac, or (no cache entry) the IPAM's entry of mac in the vnet's zone,
// cached, found or not (Ipams.pm get_ips_from_mac, PVEPlugin.pm
// get_ips_from_mac; of two entries of one MAC Perl's hash order picks
// one, here the last in address order).
func (s *Server) ipsFromMACLocked(vnet, mac string) (string, error) {
	zone := s.dhcpZoneLocked(vnet)
	if zone == "" || mac == "" {
		return "", nil
	}
	if e, ok := s.macCache[mac]; ok {
		return e.ip4, nil
	}
	db := s.ipam[zone]
	if db == nil {
		return "", fail("zone %s don't exist in ipam db", zone)
	}
	var ip4 netip.Addr
	for _, cidr := range sortedKeys(db) {
		for ip, e := range db[cidr] {
			a, err := netip.ParseAddr(ip)
			if err == nil && a.Is4() && e.mac != "" && e.mac == mac && ip4.Less(a) {
				ip4 = a
			}
		}
	}
	found := ""
	if ip4.IsValid() {
		found = ip4.String()
	}
	s.macCache[mac] = &macCacheEntry{ip4: found}
	return found, nil
}

// delIPLocked is Vnets.pm del_ip: the entry of ip in the vnet's running
// subnet holding it goes (Subnets.pm del_ip, PVEPlugin.pm del_ip), and,
// with a MAC, that MAC's cached address.
func (s *Server) delIPLocked(vnet string, ip netip.Addr, mac string) error {
	zone, cidr, _, err := s.vnetSubnetLocked(vnet, ip)
	if err != nil {
		return err
	}
	if s.sdn.pending.zones[zone]["ipam"] != "pve" {
		return nil
	}
	db := s.ipam[zone][cidr]
	if s.ipam[zone] == nil {
		return fail("zone %s don't exist in ipam db", zone)
	}
	if db == nil {
		return fail("subnet %s don't exist in ipam db", cidr)
	}
	if db[ip.String()] == nil {
		return fail("IP '%s' does not exist in IPAM DB", ip)
	}
	delete(db, ip.String())
	if mac != "" {
		s.delCacheMACIPLocked(mac)
	}
	return nil
}

// delIPsFromMACLocked is Vnets.pm del_ips_from_mac: the one IPv4 address
// get_ips_from_mac gives for mac is deleted (another entry of the same
// MAC stays).
func (s *Server) delIPsFromMACLocked(vnet, mac string) error {
	ip4, err := s.ipsFromMACLocked(vnet, mac)
	if err != nil || ip4 == "" {
		return err
	}
	return s.delIPLocked(vnet, netip.MustParseAddr(ip4), mac)
}

// addNextFreeCIDRLocked is Vnets.pm add_next_free_cidr for IPv4 (qemu-server
// calls it with dhcprange for every NIC of a clone, create_ifaces_ipams_ips,
// and of a config change that adds a NIC or changes its bridge or MAC,
// vmconfig_apply_pending): the first free IP of the vnet's running IPv4
// subnets, in subnet id order (Subnets.pm add_next_free_ip). A subnet with
// a dhcp-range is tried range after range, in their order (PVEPlugin.pm
// add_range_next_freeip walks a range from its start and dies "No free IP
// left in Range" when it is full, which cfs_lock_file turns into an undef
// answer, so the next range, then the next subnet, is tried); a subnet
// without one allocates from its whole prefix (PVEPlugin.pm add_next_freeip:
// freeIPOfPrefix), and a full prefix is an error at once, no later subnet
// tried. An entry of mac, vmid and hostname, and mac's cached address.
// Every range of every subnet full: "can't find any free ip in zone <zone>
// for IPv4". The MAC is not looked up first: a MAC that has an entry gets
// a second one (the reference plugin patches pve-network's Subnets.pm
// add_next_free_ip for that; stock Proxmox does not). The whole walk runs
// under the server's one lock, as each allocation's under cfs_lock_file on
// the IPAM database: of two allocations racing for a range's last free
// address one gets it and the other the next range's first.
func (s *Server) addNextFreeCIDRLocked(vnet, mac string, vmid int, hostname string) error {
	zone := s.dhcpZoneLocked(vnet)
	if zone == "" {
		return nil
	}
	subnets := 0
	for _, id := range sortedKeys(s.sdn.running.subnets) {
		sn := s.sdn.running.subnets[id]
		p, err := netip.ParsePrefix(sn["cidr"])
		if sn["vnet"] != vnet || err != nil || !p.Addr().Is4() {
			continue
		}
		subnets++
		db := s.ipam[zone][sn["cidr"]]
		if db == nil {
			return fail("subnet '%s' doesn't exist in IPAM DB", sn["cidr"])
		}
		var free netip.Addr
		if sn["dhcp-range"] == "" {
			if free, err = freeIPOfPrefix(p, db); err != nil {
				return err
			}
		}
		for _, r := range dhcpRanges(sn["dhcp-range"]) {
			for a := r.Start; !free.IsValid() && a.IsValid() && !r.End.Less(a); a = a.Next() {
				if db[a.String()] == nil {
					free = a
				}
			}
		}
		if free.IsValid() {
			db[free.String()] = &ipamEntry{mac: mac, vmid: vmid, hostname: hostname}
			s.addCacheMACIPLocked(mac, free.String())
			return nil
		}
	}
	if subnets > 0 {
		return fail("can't find any free ip in zone %s for IPv4", zone)
	}
	return nil
}

// freeIPOfPrefix is PVEPlugin.pm add_next_freeip for an IPv4 subnet p
// without a dhcp-range, db its IPAM entries: the first address after the
// network address that db does not hold (the gateway's is held: .2 on a
// subnet whose gateway is .1), up to NetAddr::IP's last (the broadcast
// address less one; the broadcast address itself in a /31); a /32 is its
// network address. None free: "can't find free ip in subnet '<cidr>'"
// ("cannot find free IP in subnet '<cidr>'" for a /32).
func freeIPOfPrefix(p netip.Prefix, db map[string]*ipamEntry) (netip.Addr, error) {
	p = p.Masked()
	if p.Bits() == 32 {
		if db[p.Addr().String()] != nil {
			return netip.Addr{}, fail("cannot find free IP in subnet '%s'", p)
		}
		return p.Addr(), nil
	}
	last := lastOfPrefix(p)
	if p.Bits() < 31 {
		last = last.Prev()
	}
	for a := p.Addr().Next(); a.IsValid() && !last.Less(a); a = a.Next() {
		if db[a.String()] == nil {
			return a, nil
		}
	}
	return netip.Addr{}, fail("can't find free ip in subnet '%s'", p)
}

// lastOfPrefix is the highest address of an IPv4 prefix (its broadcast
// address).
func lastOfPrefix(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	n := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	n |= uint32(1)<<(32-p.Bits()) - 1
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

// dhcpMappingIPLocked is the IPAM part of Vnets.pm add_dhcp_mapping, which
// a start's pve-bridge hook runs for each NIC before QEMU plugs it: the
// MAC's IPv4 address (get_ips_from_mac), one allocated when it has none
// (add_next_free_cidr: of the ranges, or of the prefix of a subnet without
// any); that address is what Dhcp.pm add_mapping writes into the zone's
// ethers file. Zero when the vnet's zone has no IPAM and DHCP.
func (s *Server) dhcpMappingIPLocked(vnet, mac string, vmid int, hostname string) (netip.Addr, error) {
	if mac == "" || s.dhcpZoneLocked(vnet) == "" {
		return netip.Addr{}, nil
	}
	ip4, err := s.ipsFromMACLocked(vnet, mac)
	if err != nil {
		return netip.Addr{}, err
	}
	if ip4 == "" {
		if err := s.addNextFreeCIDRLocked(vnet, mac, vmid, hostname); err != nil {
			return netip.Addr{}, err
		}
		if ip4, err = s.ipsFromMACLocked(vnet, mac); err != nil || ip4 == "" {
			return netip.Addr{}, err
		}
	}
	return netip.ParseAddr(ip4)
}

// dhcpRanges parses a subnet's "start-address=..,end-address=.." ranges
// (stored joined by "|"), in order.
func dhcpRanges(rs string) []AddrRange {
	var out []AddrRange
	for _, r := range strings.Split(rs, "|") {
		var ar AddrRange
		for _, part := range strings.Split(r, ",") {
			k, v, _ := strings.Cut(part, "=")
			switch k {
			case "start-address":
				ar.Start, _ = netip.ParseAddr(v)
			case "end-address":
				ar.End, _ = netip.ParseAddr(v)
			}
		}
		if ar.Start.IsValid() && ar.End.IsValid() {
			out = append(out, ar)
		}
	}
	return out
}

// ipamNICsLocked applies a config's NIC effects on the IPAM, old the
// config before, cur after (nil for a clone's new config and a destroy):
// a new NIC gets an entry (add_next_free_cidr); a NIC whose bridge or MAC
// changed gives its address back (del_ips_from_mac) and gets an entry on
// its new bridge; a NIC removed, or every NIC of a destroyed VM, gives
// its address back (qemu-server QemuServer.pm vmconfig_apply_pending,
// QemuServer/Network.pm create_ifaces_ipams_ips, delete_ifaces_ipams_ips).
// A NIC changed otherwise keeps its entry. Errors giving an address back
// are only warned about by qemu-server: they are not returned.
func (s *Server) ipamNICsLocked(vmid int, old, cur map[string]string) error {
	return s.ipamNICsOfLocked(vmid, old, cur, parseNet, cur["name"])
}

// ipamNICsOfLocked is ipamNICsLocked for NICs parse reads (a VM's or a
// CT's net[n]), the new entries named hostname.
func (s *Server) ipamNICsOfLocked(vmid int, old, cur map[string]string, parse func(string) (mac, bridge string), hostname string) error {
	keys := map[string]bool{}
	for k := range old {
		keys[k] = true
	}
	for k := range cur {
		keys[k] = true
	}
	for _, k := range sortedKeys(keys) {
		if !reNetKey.MatchString(k) || old[k] == cur[k] {
			continue
		}
		om, ob := parse(old[k])
		nm, nb := parse(cur[k])
		switch {
		case cur[k] == "":
			_ = s.delIPsFromMACLocked(ob, om)
		case old[k] == "":
			if err := s.addNextFreeCIDRLocked(nb, nm, vmid, hostname); err != nil {
				return err
			}
		case ob != "" && om != "" && (ob != nb || om != nm):
			_ = s.delIPsFromMACLocked(ob, om)
			if err := s.addNextFreeCIDRLocked(nb, nm, vmid, hostname); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Server) ipamStatus(_ context.Context, rq *request) (any, error) {
	if id := rq.str("ipam"); id != "pve" {
		return nil, fail("sdn ipam '%s' does not exist", id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, zone := range sortedKeys(s.ipam) {
		z := s.sdn.running.zones[zone]
		if z == nil || z["ipam"] != "pve" || z["dhcp"] == "" {
			continue
		}
		for _, cidr := range sortedKeys(s.ipam[zone]) {
			vnet := ""
			for _, sn := range s.sdn.running.subnets {
				if sn["cidr"] == cidr && s.sdn.running.vnets[sn["vnet"]]["zone"] == zone {
					vnet = sn["vnet"]
				}
			}
			if vnet == "" || !s.canSDN(rq.authid, "/sdn/zones/"+zone+"/"+vnet) {
				continue
			}
			ips := sortedKeys(s.ipam[zone][cidr])
			sort.Slice(ips, func(i, j int) bool {
				a, _ := netip.ParseAddr(ips[i])
				b, _ := netip.ParseAddr(ips[j])
				return a.Less(b)
			})
			for _, ip := range ips {
				e := s.ipam[zone][cidr][ip]
				m := map[string]any{"zone": zone, "subnet": cidr, "ip": ip, "vnet": vnet}
				if e.gateway {
					m["gateway"] = 1
				}
				if e.mac != "" {
					m["mac"] = e.mac
				}
				if e.vmid != 0 {
					m["vmid"] = e.vmid
				}
				if e.hostname != "" {
					m["hostname"] = e.hostname
				}
				out = append(out, m)
			}
		}
	}
	return out, nil
}

// vnetIP handles POST and DELETE /cluster/sdn/vnets/{vnet}/ips (pve-network
// API2/Network/SDN/Ips.pm ipcreate, ipdelete; the permission on
// /sdn/zones/{zone}/{vnet} is the schema's). The IP must lie in one of the
// vnet's running subnets (Vnets.pm get_subnet_from_vnet_ip). A create is
// Subnets.pm add_ip: PVEPlugin.pm add_ip refuses an IP the IPAM holds (the
// gateway's included) and stores the MAC as sent, no vmid, no hostname;
// the MAC's cached address becomes the IP (a MAC that has an entry gets a
// second one). A delete is Subnets.pm del_ip: with a MAC, that MAC's
// cached address goes too. The emulator's one lock makes two calls for
// one IP one after the other, as cfs_lock_file on the IPAM database does:
// the second create is refused.
func (s *Server) vnetIP(add bool) handlerFunc {
	return func(_ context.Context, rq *request) (any, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		vnet := rq.str("vnet")
		mac := rq.str("mac")
		ip, err := netip.ParseAddr(rq.str("ip"))
		if err != nil {
			return nil, paramFail(ParamErrors{"ip": "value does not look like a valid IP address"})
		}
		if !add {
			return nil, s.delIPLocked(vnet, ip, mac)
		}
		zone, cidr, _, err := s.vnetSubnetLocked(vnet, ip)
		if err != nil {
			return nil, err
		}
		if s.sdn.pending.zones[zone]["ipam"] != "pve" {
			return nil, nil
		}
		if err := s.ipamAddLocked(zone, cidr, ip.String(), &ipamEntry{mac: mac}); err != nil {
			return nil, err
		}
		s.addCacheMACIPLocked(mac, ip.String())
		return nil, nil
	}
}

// MACCache lists Proxmox's MAC cache as "mac ip" lines, sorted (tests:
// nothing of a sandbox is left in it after its delete).
func (s *Server) MACCache() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for mac, e := range s.macCache {
		out = append(out, mac+" "+e.ip4)
	}
	sort.Strings(out)
	return out
}

// IPAMZones lists the zones that hold any entry of the pve IPAM database,
// running or not (tests: an entry left of a zone that is gone).
func (s *Server) IPAMZones() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, zone := range sortedKeys(s.ipam) {
		for _, db := range s.ipam[zone] {
			if len(db) > 0 {
				out = append(out, zone)
				break
			}
		}
	}
	return out
}

// IPAMEntries lists the IPAM entries of a zone as "cidr ip mac" lines
// (gateways as "cidr ip gateway"), sorted, for tests.
func (s *Server) IPAMEntries(zone string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for cidr, db := range s.ipam[zone] {
		for ip, e := range db {
			what := e.mac
			if e.gateway {
				what = "gateway"
			}
			out = append(out, fmt.Sprintf("%s %s %s", cidr, ip, what))
		}
	}
	sort.Strings(out)
	return out
}

// SubnetDHCPRanges lists the running subnets of a zone as "cidr
// start-end,start-end" lines (their dhcp-range entries in order; "cidr"
// alone without any), sorted, for tests.
func (s *Server) SubnetDHCPRanges(zone string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, sn := range s.sdn.running.subnets {
		if sn["zone"] != zone {
			continue
		}
		var rs []string
		for _, r := range dhcpRanges(sn["dhcp-range"]) {
			rs = append(rs, r.Start.String()+"-"+r.End.String())
		}
		out = append(out, strings.TrimSpace(sn["cidr"]+" "+strings.Join(rs, ",")))
	}
	sort.Strings(out)
	return out
}
