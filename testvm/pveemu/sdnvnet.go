package pveemu

import (
	"context"
)

func (s *Server) listVNets(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return listing("vnet", s.sdn.pending.vnets, s.sdn.running.vnets, rq.bool("pending", false), rq.bool("running", false),
		func(id string, p map[string]string) bool {
			return s.canSDN(rq.authid, "/sdn/zones/"+p["zone"]+"/"+id)
		}), nil
}

func (s *Server) getVNet(_ context.Context, rq *request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := rq.str("vnet")
	src := s.sdn.pending.vnets
	if rq.bool("running", false) {
		src = s.sdn.running.vnets
	}
	v, ok := src[id]
	if !ok {
		return nil, fail("sdn vnet '%s' does not exist", id)
	}
	if !s.canSDN(rq.authid, "/sdn/zones/"+v["zone"]+"/"+id) {
		return nil, permFail("/sdn/zones/" + v["zone"] + "/" + id + ", SDN.Allocate|SDN.Audit")
	}
	return objectMap("vnet", id, v), nil
}

func (s *Server) createVNet(ctx context.Context, rq *request) (any, error) {
	return sdnLocked("create sdn vnet object failed", s.createVNetBody(ctx, rq))
}

func (s *Server) createVNetBody(_ context.Context, rq *request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, zone := rq.str("vnet"), rq.str("zone")
	if err := s.checkPrivsLocked(rq.authid, "/sdn/zones/"+zone, []string{"SDN.Allocate"}); err != nil {
		return err
	}
	if _, ok := s.sdn.pending.vnets[id]; ok {
		return fail("sdn vnet object ID '%s' already defined", id)
	}
	if _, ok := s.sdn.pending.zones[zone]; !ok {
		return paramFail(ParamErrors{"zone": "zone '" + zone + "' don't exist"})
	}
	if rq.has("tag") {
		return fail("tag is not allowed on simple zones")
	}
	v := map[string]string{"zone": zone, "type": "vnet"}
	for _, k := range []string{"alias", "vlanaware", "isolate-ports"} {
		if rq.has(k) {
			v[k] = rq.str(k)
		}
	}
	s.sdn.pending.vnets[id] = v
	return nil
}

func (s *Server) deleteVNet(ctx context.Context, rq *request) (any, error) {
	return sdnLocked("delete sdn vnet object failed", s.deleteVNetBody(ctx, rq))
}

func (s *Server) deleteVNetBody(_ context.Context, rq *request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := rq.str("vnet")
	v, ok := s.sdn.pending.vnets[id]
	if !ok {
		return fail("sdn vnet '%s' does not exist", id)
	}
	if err := s.checkPrivsLocked(rq.authid, "/sdn/zones/"+v["zone"]+"/"+id, []string{"SDN.Allocate"}); err != nil {
		return err
	}
	for _, sn := range s.sdn.pending.subnets {
		if sn["vnet"] == id {
			return paramFail(ParamErrors{"vnet": "Can't delete vnet if subnets exists"})
		}
	}
	delete(s.sdn.pending.vnets, id)
	return nil
}
