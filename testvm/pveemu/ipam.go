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

// ipamAddNICLocked gives a VM NIC on a vnet the next free IP of the dhcp
// range of the vnet's first running subnet, when the vnet's zone has the
// pve IPAM and DHCP (Vnets::add_next_free_cidr with dhcprange, called by
// qemu-server's create_ifaces_ipams_ips and vmconfig_apply_pending). A
// MAC that already has an entry keeps it.
func (s *Server) ipamAddNICLocked(vnet, mac string, vmid int, hostname string) error {
	v := s.sdn.pending.vnets[vnet]
	if v == nil || mac == "" {
		return nil
	}
	z := s.sdn.pending.zones[v["zone"]]
	if z["ipam"] != "pve" || z["dhcp"] == "" {
		return nil
	}
	for _, id := range sortedKeys(s.sdn.running.subnets) {
		sn := s.sdn.running.subnets[id]
		if sn["vnet"] != vnet || sn["dhcp-range"] == "" {
			continue
		}
		db := s.ipam[v["zone"]][sn["cidr"]]
		if db == nil {
			continue
		}
		for _, e := range db {
			if strings.EqualFold(e.mac, mac) {
				return nil
			}
		}
		start, end := dhcpRange(sn["dhcp-range"])
		for a := start; a.IsValid() && !end.Less(a); a = a.Next() {
			if db[a.String()] == nil {
				db[a.String()] = &ipamEntry{mac: strings.ToUpper(mac), vmid: vmid, hostname: hostname}
				return nil
			}
		}
		return fail("No free IP left in Range %s:%s", start, end)
	}
	return nil
}

// ipamIPLocked is the IPAM address of mac on vnet (zero when none).
func (s *Server) ipamIPLocked(vnet, mac string) netip.Addr {
	v := s.sdn.running.vnets[vnet]
	if v == nil {
		return netip.Addr{}
	}
	for _, db := range s.ipam[v["zone"]] {
		for ip, e := range db {
			if !e.gateway && strings.EqualFold(e.mac, mac) {
				a, _ := netip.ParseAddr(ip)
				return a
			}
		}
	}
	return netip.Addr{}
}

// dhcpRange parses the first "start-address=..,end-address=.." range.
func dhcpRange(r string) (start, end netip.Addr) {
	first, _, _ := strings.Cut(r, "|")
	for _, part := range strings.Split(first, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "start-address":
			start, _ = netip.ParseAddr(v)
		case "end-address":
			end, _ = netip.ParseAddr(v)
		}
	}
	return start, end
}

// ipamDelMACLocked drops a NIC's entries (Vnets::del_ips_from_mac).
func (s *Server) ipamDelMACLocked(vnet, mac string) {
	v := s.sdn.pending.vnets[vnet]
	if v == nil {
		v = s.sdn.running.vnets[vnet]
	}
	if v == nil || mac == "" {
		return
	}
	for _, db := range s.ipam[v["zone"]] {
		for ip, e := range db {
			if !e.gateway && strings.EqualFold(e.mac, mac) {
				delete(db, ip)
			}
		}
	}
}

// ipamNICsLocked applies a config change's NIC effects on the IPAM:
// a NIC whose bridge or MAC changed, or that was removed, gives its entry
// back; a new or changed one gets an entry.
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
	for k := range keys {
		if !reNetKey.MatchString(k) || old[k] == cur[k] {
			continue
		}
		om, ob := parse(old[k])
		nm, nb := parse(cur[k])
		if old[k] != "" && (om != nm || ob != nb) {
			s.ipamDelMACLocked(ob, om)
		}
		if cur[k] != "" {
			if err := s.ipamAddNICLocked(nb, nm, vmid, hostname); err != nil {
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
// API2/Network/SDN/Ips.pm): the permission on /sdn/zones/{zone}/{vnet} is
// the schema's; the IP must lie in one of the vnet's running subnets.
func (s *Server) vnetIP(add bool) handlerFunc {
	return func(_ context.Context, rq *request) (any, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		vnet := rq.str("vnet")
		ip, err := netip.ParseAddr(rq.str("ip"))
		if err != nil {
			return nil, paramFail(ParamErrors{"ip": "value does not look like a valid IP address"})
		}
		zone, cidr, _, err := s.vnetSubnetLocked(vnet, ip)
		if err != nil {
			return nil, err
		}
		if add {
			return nil, s.ipamAddLocked(zone, cidr, ip.String(), &ipamEntry{mac: strings.ToUpper(rq.str("mac"))})
		}
		db := s.ipam[zone][cidr]
		if db == nil {
			return nil, fail("subnet %s don't exist in ipam db", cidr)
		}
		if db[ip.String()] == nil {
			return nil, fail("IP '%s' does not exist in IPAM DB", ip)
		}
		delete(db, ip.String())
		return nil, nil
	}
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
