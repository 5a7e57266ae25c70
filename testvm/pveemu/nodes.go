package pveemu

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// ClusterNode is one more node of the emulated cluster (Options.Cluster):
// it shares the cluster's configuration (SDN, VMID space, pools, users and
// ACLs, /cluster/resources) with the others and runs its own zones and
// guests on its backend.
type ClusterNode struct {
	Name    string
	Backend Backend
}

// clusterNode is a node's own state: whether it is up and what its network
// runs (the SDN configuration its last reload applied).
type clusterNode struct {
	name    string
	nodeid  int
	backend Backend
	online  bool
	applied sdnObjects
	// staged is a staged host network edit (interfaces.new, its diff)
	// the next reload of the node applies; appliedEdits the ones reloads
	// applied.
	staged       string
	appliedEdits []string
	// bridges are the host's own Linux bridges in its
	// /etc/network/interfaces (vmbr0; AddHostBridge).
	bridges []string
	// reloading is set while a reload runs on the node (ifupdown2's
	// lock); dhcpStopped while that reload has every dnsmasq@* of the
	// node stopped (Dnsmasq.pm before_regenerate, until each zone's is
	// started again).
	reloading, dhcpStopped bool
	// dhcpMapped are the "vnet mac" pairs whose mapping is in the zone's
	// ethers file on the node (a first start adds it and reloads the
	// zone's dnsmasq).
	dhcpMapped map[string]bool
}

// initNodes registers the primary node and Options.Cluster.
func (s *Server) initNodes(o Options) error {
	s.members = map[string]*clusterNode{}
	add := func(name string, b Backend) error {
		if b == nil {
			return fmt.Errorf("pveemu: node %s: a backend is required", name)
		}
		if err := namedFormats["pve-node"](name); err != nil {
			return fmt.Errorf("pveemu: node name %q: %s", name, strings.TrimSpace(err.Error()))
		}
		if s.members[name] != nil {
			return fmt.Errorf("pveemu: node %s given twice", name)
		}
		s.members[name] = &clusterNode{name: name, nodeid: len(s.nodeNames) + 1, backend: b, online: true, applied: newSDNObjects(), bridges: []string{"vmbr0"}}
		s.nodeNames = append(s.nodeNames, name)
		return nil
	}
	if err := add(o.Node, o.Backend); err != nil {
		return err
	}
	for _, n := range o.Cluster {
		if err := add(n.Name, n.Backend); err != nil {
			return err
		}
	}
	return nil
}

// vmNodeLocked is the node a VM's config lives on
// (/etc/pve/nodes/<node>/qemu-server/<vmid>.conf).
func (s *Server) vmNodeLocked(v *vm) string {
	if v.node == "" {
		return s.node
	}
	return v.node
}

// backendOf is the backend of the node the VM lives on (the primary's for
// a VM that does not exist).
func (s *Server) backendOf(vmid int) Backend {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.backendOfLocked(s.vms[vmid])
}

// backendOfLocked is backendOf for a VM loaded under s.mu (nil: the
// primary's).
func (s *Server) backendOfLocked(v *vm) Backend {
	if v != nil {
		return s.nodeBackend(s.vmNodeLocked(v))
	}
	return s.backend
}

// nodeBackend is a node's backend; the primary's is s.backend (which
// tests may replace after New).
func (s *Server) nodeBackend(name string) Backend {
	if n := s.members[name]; n != nil && name != s.node {
		return n.backend
	}
	return s.backend
}

// SetNodeOnline takes a node down or brings it back, as powering it off or
// on would: while down, its own API endpoint (NodeHandler) hangs up, the
// other nodes answer requests proxied to it with 595, the SDN reload
// warns for it, and its guests are unreachable. Back up, its network still
// runs what its last reload applied until the next SDN apply.
func (s *Server) SetNodeOnline(name string, online bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.members[name]
	if n == nil {
		return fmt.Errorf("pveemu: no node %s", name)
	}
	n.online = online
	return nil
}

// MoveVM puts a VM's config on another node, as an offline migration does
// (tests place a template on each node with it).
func (s *Server) MoveVM(vmid int, node string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.vms[vmid]
	if v == nil {
		return fmt.Errorf("pveemu: no VM %d", vmid)
	}
	if s.members[node] == nil {
		return fmt.Errorf("pveemu: no node %s", node)
	}
	if v.running {
		return fmt.Errorf("pveemu: VM %d is running", vmid)
	}
	v.node = node
	return nil
}

// NodeHandler is the API as the named node's pveproxy serves it: tasks the
// cluster-wide calls start (PUT /cluster/sdn) run on that node. While the
// node is down it answers nothing (the connection is closed). The Server's
// own ServeHTTP is its primary node's.
func (s *Server) NodeHandler(name string) (http.Handler, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.members[name] == nil {
		return nil, fmt.Errorf("pveemu: no node %s", name)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		up := s.members[name].online
		s.mu.Unlock()
		if !up {
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					_ = conn.Close()
					return
				}
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		s.serveAs(w, r, name)
	}), nil
}

// nodeDownLocked is pveproxy's answer to a request it proxies to a node
// that is down (PVE::APIServer::AnyEvent proxy_request: the connection
// error as a 595). Guess: the exact text depends on how the node is gone
// ("No route to host" for one powered off).
func nodeDownLocked(node string) error {
	return &apiError{code: 595, msg: fmt.Sprintf("Errors during connection establishment, proxy handshake: No route to host (node %s)\n", node)}
}

// checkClusterNodeLocked makes the checks a request for /nodes/{node}/...
// meets before its handler: pveproxy proxies it to the node (proxyto =>
// 'node'), so a node that is down answers 595. An unknown node is left to
// the handler's own check.
func (s *Server) checkClusterNodeLocked(node string) error {
	if n := s.members[node]; n != nil && !n.online {
		return nodeDownLocked(node)
	}
	return nil
}

// checkVMNode refuses a /nodes/{node}/qemu/{vmid}/... or
// /nodes/{node}/lxc/{vmid}/... request for a guest whose config is on
// another node or of the other kind: qemu-server's and pve-container's
// load_config read /etc/pve/nodes/<node>/qemu-server/<vmid>.conf and
// .../lxc/<vmid>.conf, which do not exist.
func (s *Server) checkVMNode(route string, vars map[string]string) error {
	node, id := vars["node"], vars["vmid"]
	if node == "" || id == "" {
		return nil
	}
	vmid, err := strconv.Atoi(id)
	if err != nil {
		return nil
	}
	kind := kindQemu
	if strings.HasPrefix(route, "/nodes/{node}/lxc/") {
		kind = kindLXC
	} else if !strings.HasPrefix(route, "/nodes/{node}/qemu/") {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.vms[vmid]; v != nil && s.members[node] != nil && (s.vmNodeLocked(v) != node || v.kind != kind) {
		return fail("Configuration file 'nodes/%s/%s/%d.conf' does not exist", node, kind.confDir(), vmid)
	}
	return nil
}

// zoneOnNode reports whether a zone's vnets run on node: a zone whose
// "nodes" list is set runs only there (pve-network Zones.pm
// generate_etc_network_config: next if the zone's nodes exclude the node).
func zoneOnNode(zone map[string]string, node string) bool {
	ns := zone["nodes"]
	if ns == "" {
		return true
	}
	return slices.Contains(splitList(ns), node)
}

// bridgeOnLocked reports whether a vnet's bridge exists on node: the
// node's backend says when it can (BridgeReporter: a reload still running
// may have made it), else its last reload applied the vnet.
func (s *Server) bridgeOnLocked(node, bridge string) bool {
	n := s.members[node]
	if n == nil {
		return false
	}
	if br, ok := s.nodeBackend(node).(BridgeReporter); ok {
		return br.HasBridge(bridge)
	}
	_, ok := n.applied.vnets[bridge]
	return ok
}
