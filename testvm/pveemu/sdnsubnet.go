package pveemu

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
)

func subnetID(zone string, p netip.Prefix) string {
	return fmt.Sprintf("%s-%s-%d", zone, p.Addr(), p.Bits())
}

func (s *Server) listSubnets(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	vnet := rq.str("vnet")
	v := s.sdn.pending.vnets[vnet]
	if v == nil {
		v = s.sdn.running.vnets[vnet]
	}
	if v == nil {
		return nil, fail("sdn vnet '%s' does not exist", vnet)
	}
	out := listing("subnet", s.sdn.pending.subnets, s.sdn.running.subnets, rq.bool("pending", false), rq.bool("running", false),
		func(id string, p map[string]string) bool {
			return p["vnet"] == vnet && s.canSDN(rq.authid, "/sdn/zones/"+v["zone"]+"/"+vnet)
		})
	// Subnets::sdn_subnets_config adds these, from the id, to every
	// listed subnet (pending ones too) on top.
	for _, e := range out {
		id, _ := e["subnet"].(string)
		parts := strings.Split(id, "-")
		if len(parts) < 3 {
			continue
		}
		zone, network, mask := strings.Join(parts[:len(parts)-2], "-"), parts[len(parts)-2], parts[len(parts)-1]
		e["id"], e["zone"], e["network"], e["mask"], e["cidr"] = id, zone, network, mask, network+"/"+mask
	}
	return out, nil
}

func (s *Server) findSubnet(src map[string]map[string]string, vnet, sub string) (string, map[string]string) {
	for id, sn := range src {
		if sn["vnet"] != vnet {
			continue
		}
		if id == sub || sn["cidr"] == sub || strings.HasSuffix(id, "-"+strings.ReplaceAll(sub, "/", "-")) {
			return id, sn
		}
	}
	return "", nil
}

func (s *Server) getSubnet(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	vnet := rq.str("vnet")
	src := s.sdn.pending.subnets
	if rq.bool("running", false) {
		src = s.sdn.running.subnets
	}
	id, sn := s.findSubnet(src, vnet, rq.str("subnet"))
	if sn == nil {
		return nil, fail("sdn subnet '%s' does not exist", rq.str("subnet"))
	}
	return objectMap("subnet", id, sn), nil
}

func (s *Server) createSubnet(ctx context.Context, rq *request) (any, error) {
	return sdnLocked("create sdn subnet object failed", s.createSubnetBody(ctx, rq))
}

func (s *Server) createSubnetBody(_ context.Context, rq *request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	vnetID := rq.str("vnet")
	vnet := s.sdn.pending.vnets[vnetID]
	if vnet == nil {
		return paramFail(ParamErrors{"vnet": vnetID + " don't exist"})
	}
	if err := s.checkPrivsLocked(rq.authid, "/sdn/zones/"+vnet["zone"]+"/"+vnetID, []string{"SDN.Allocate"}); err != nil {
		return err
	}
	cidr, err := netip.ParsePrefix(rq.str("subnet"))
	if err != nil {
		return paramFail(ParamErrors{"subnet": "value does not look like a valid CIDR network\n"})
	}
	cidr = cidr.Masked()
	id := subnetID(vnet["zone"], cidr)
	if _, ok := s.sdn.pending.subnets[id]; ok {
		return fail("sdn subnet object ID '%s' already defined", id)
	}
	sn := map[string]string{"vnet": vnetID, "type": "subnet", "cidr": cidr.String(), "network": cidr.Addr().String(), "mask": fmt.Sprint(cidr.Bits()), "zone": vnet["zone"]}
	if gw := rq.str("gateway"); gw != "" {
		a, err := netip.ParseAddr(gw)
		if err != nil || !cidr.Contains(a) {
			return paramFail(ParamErrors{"gateway": fmt.Sprintf("%s is not in subnet %s", gw, cidr)})
		}
		sn["gateway"] = gw
	}
	if rq.has("snat") {
		sn["snat"] = rq.str("snat")
	}
	// SubnetPlugin.pm validate_dhcp_ranges: each range in turn, and each
	// against the ones before it (Net::IP overlaps: sharing one address
	// is overlapping).
	var ranges []string
	var seen [][2]netip.Addr
	for _, r := range rq.strings("dhcp-range") {
		start, end := "", ""
		for _, part := range strings.Split(r, ",") {
			k, v, _ := strings.Cut(part, "=")
			switch k {
			case "start-address":
				start = v
			case "end-address":
				end = v
			}
		}
		a, err1 := netip.ParseAddr(start)
		b, err2 := netip.ParseAddr(end)
		switch {
		case err1 != nil:
			return paramFail(ParamErrors{"dhcp-range": "start-address is not a valid IP " + start})
		case err2 != nil:
			return paramFail(ParamErrors{"dhcp-range": "end-address is not a valid IP " + end})
		case b.Less(a):
			return paramFail(ParamErrors{"dhcp-range": fmt.Sprintf("start-address %s must be smaller than end-address %s", start, end)})
		case !cidr.Contains(a):
			return paramFail(ParamErrors{"dhcp-range": fmt.Sprintf("start-address %s is not in subnet %s", start, cidr)})
		case !cidr.Contains(b):
			return paramFail(ParamErrors{"dhcp-range": fmt.Sprintf("end-address %s is not in subnet %s", end, cidr)})
		}
		for _, o := range seen {
			if !b.Less(o[0]) && !o[1].Less(a) {
				return paramFail(ParamErrors{"dhcp-range": "dhcp ranges must not overlap"})
			}
		}
		seen = append(seen, [2]netip.Addr{a, b})
		ranges = append(ranges, r)
	}
	if len(ranges) > 0 {
		sn["dhcp-range"] = strings.Join(ranges, "|")
	}
	for _, k := range []string{"dnszoneprefix", "dhcp-dns-server"} {
		if rq.has(k) {
			sn[k] = rq.str(k)
		}
	}
	s.sdn.pending.subnets[id] = sn
	s.ipamAddSubnetLocked(vnet["zone"], cidr.String(), sn["gateway"])
	return nil
}

func (s *Server) deleteSubnet(ctx context.Context, rq *request) (any, error) {
	return sdnLocked("delete sdn subnet object failed", s.deleteSubnetBody(ctx, rq))
}

func (s *Server) deleteSubnetBody(_ context.Context, rq *request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	vnetID := rq.str("vnet")
	id, sn := s.findSubnet(s.sdn.pending.subnets, vnetID, rq.str("subnet"))
	if sn == nil {
		return fail("sdn subnet '%s' does not exist", rq.str("subnet"))
	}
	if err := s.checkPrivsLocked(rq.authid, "/sdn/zones/"+sn["zone"]+"/"+vnetID, []string{"SDN.Allocate"}); err != nil {
		return err
	}
	if err := s.ipamDelSubnetLocked(sn["zone"], sn["cidr"]); err != nil {
		return err
	}
	delete(s.sdn.pending.subnets, id)
	return nil
}
