package pveemu

import "context"

func (s *Server) registerRoutes() error {
	q := "/nodes/{node}/qemu/{vmid}"
	table := []struct {
		method, path string
		h            handlerFunc
	}{
		{"GET", "/version", s.version},
		{"GET", "/nodes", s.nodes},
		{"GET", "/cluster/status", s.clusterStatus},
		{"GET", "/nodes/{node}/status", s.nodeStatus},
		{"GET", "/cluster/nextid", s.nextID},
		{"GET", "/cluster/resources", s.resources},
		{"GET", "/nodes/{node}/qemu", s.listVMs},
		{"POST", "/nodes/{node}/qemu", s.createVM},
		{"GET", q, s.vmIndex},
		{"DELETE", q, s.deleteVM},
		{"POST", q + "/clone", s.cloneVM},
		{"GET", q + "/config", s.getConfig},
		{"POST", q + "/config", func(ctx context.Context, rq *request) (any, error) { return s.updateConfig(ctx, rq, true) }},
		{"PUT", q + "/config", func(ctx context.Context, rq *request) (any, error) { return s.updateConfig(ctx, rq, false) }},
		{"GET", q + "/status/current", s.statusCurrent},
		{"POST", q + "/status/start", s.vmAction("qmstart")},
		{"POST", q + "/status/stop", s.vmAction("qmstop")},
		{"POST", q + "/status/shutdown", s.vmAction("qmshutdown")},
		{"POST", q + "/template", s.templateVM},
		{"PUT", q + "/resize", s.resizeVM},
		{"GET", q + "/snapshot", s.listSnapshots},
		{"POST", q + "/snapshot", s.createSnapshot},
		{"DELETE", q + "/snapshot/{snapname}", s.deleteSnapshot},
		{"POST", q + "/snapshot/{snapname}/rollback", s.rollbackSnapshot},
		{"POST", q + "/agent/ping", s.agentPing},
		{"POST", q + "/agent/exec", s.agentExec},
		{"GET", q + "/agent/get-osinfo", s.agentSimple("get-osinfo")},
		{"GET", q + "/agent/exec-status", s.agentExecStatus},
		{"GET", q + "/agent/file-read", s.agentFileRead},
		{"POST", q + "/agent/file-write", s.agentFileWrite},
		{"GET", "/nodes/{node}/tasks/{upid}/status", s.taskStatus},
		{"GET", "/cluster/tasks", s.clusterTasks},
		{"GET", "/nodes/{node}/tasks/{upid}/log", s.taskLog},
		{"GET", "/pools", s.listPools},
		{"POST", "/pools", s.createPool},
		{"GET", "/pools/{poolid}", s.getPool},
		{"PUT", "/pools/{poolid}", s.updatePool},
		{"DELETE", "/pools/{poolid}", s.deletePool},
		{"GET", "/cluster/sdn", s.sdnIndex},
		{"PUT", "/cluster/sdn", s.applySDN},
		{"GET", "/cluster/sdn/zones", s.listZones},
		{"POST", "/cluster/sdn/zones", s.createZone},
		{"GET", "/cluster/sdn/zones/{zone}", s.getZone},
		{"DELETE", "/cluster/sdn/zones/{zone}", s.deleteZone},
		{"GET", "/cluster/sdn/vnets", s.listVNets},
		{"POST", "/cluster/sdn/vnets", s.createVNet},
		{"GET", "/cluster/sdn/vnets/{vnet}", s.getVNet},
		{"DELETE", "/cluster/sdn/vnets/{vnet}", s.deleteVNet},
		{"GET", "/cluster/sdn/vnets/{vnet}/subnets", s.listSubnets},
		{"POST", "/cluster/sdn/vnets/{vnet}/subnets", s.createSubnet},
		{"GET", "/cluster/sdn/vnets/{vnet}/subnets/{subnet}", s.getSubnet},
		{"DELETE", "/cluster/sdn/vnets/{vnet}/subnets/{subnet}", s.deleteSubnet},
		{"POST", "/cluster/sdn/vnets/{vnet}/ips", s.vnetIP(true)},
		{"DELETE", "/cluster/sdn/vnets/{vnet}/ips", s.vnetIP(false)},
		{"GET", "/cluster/sdn/ipams/{ipam}/status", s.ipamStatus},
		{"GET", "/cluster/firewall/rules", s.listRules},
		{"POST", "/cluster/firewall/rules", s.createRule},
		{"GET", "/cluster/firewall/rules/{pos}", s.getRule},
		{"DELETE", "/cluster/firewall/rules/{pos}", s.deleteRule},
		{"GET", "/cluster/firewall/options", s.getFWOptions},
		{"PUT", "/cluster/firewall/options", s.putFWOptions},
		{"GET", "/nodes/{node}/firewall/rules", s.listRules},
		{"POST", "/nodes/{node}/firewall/rules", s.createRule},
		{"GET", "/nodes/{node}/firewall/rules/{pos}", s.getRule},
		{"DELETE", "/nodes/{node}/firewall/rules/{pos}", s.deleteRule},
		{"GET", "/nodes/{node}/firewall/options", s.getFWOptions},
		{"PUT", "/nodes/{node}/firewall/options", s.putFWOptions},
		{"POST", "/access/ticket", s.postTicket},
		{"GET", "/access/users", s.getUsers},
		{"POST", "/access/users", s.postUser},
		{"POST", "/access/users/{userid}/token/{tokenid}", s.postToken},
		{"DELETE", "/access/users/{userid}/token/{tokenid}", s.deleteToken},
		{"GET", "/access/acl", s.getACL},
		{"PUT", "/access/acl", s.putACL},
		{"GET", "/access/roles", s.getRoles},
	}
	for _, r := range table {
		if err := s.handle(r.method, r.path, r.h); err != nil {
			return err
		}
	}
	return nil
}
