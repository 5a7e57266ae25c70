package pveemu

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/pve-inspect/pve-inspect/pveapi/access"
)

// withAttribs is a handler's answer with result attributes beside "data"
// (PVE::RESTEnvironment set_result_attrib: pve-http-server puts each at
// the top level of the JSON answer).
type withAttribs struct {
	data    any
	attribs map[string]any
}

// StageNetworkEdit stages an edit of node's host network as the GUI's
// Network panel or `pvesh create /nodes/<node>/network` does: it is
// written to /etc/network/interfaces.new and shown as the diff in the
// "changes" of GET /nodes/<node>/network until a reload renames it over
// /etc/network/interfaces. Every SDN apply reloads every node, so it
// applies what was staged (pve-manager API2/Network.pm
// reload_network_config). diff stands for the file's diff.
func (s *Server) StageNetworkEdit(node, diff string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.members[node]
	if n == nil {
		return fmt.Errorf("pveemu: no node %q", node)
	}
	n.staged = diff
	return nil
}

// AppliedNetworkEdits returns the staged edits reloads applied on node,
// oldest first.
func (s *Server) AppliedNetworkEdits(node string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.members[node]; n != nil {
		return append([]string(nil), n.appliedEdits...)
	}
	return nil
}

// AddHostBridge adds a Linux bridge to node's /etc/network/interfaces (the
// emulator starts each node with vmbr0): a bridge GET
// /nodes/{node}/network lists. VMs whose NICs are on it cannot start (the
// backend has only the SDN vnets' bridges).
func (s *Server) AddHostBridge(node, bridge string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.members[node]
	if n == nil {
		return fmt.Errorf("pveemu: no node %q", node)
	}
	if !slices.Contains(n.bridges, bridge) {
		n.bridges = append(n.bridges, bridge)
		slices.Sort(n.bridges)
	}
	return nil
}

// networkIndex is GET /nodes/{node}/network (pve-manager API2/Network.pm
// index: user => 'all'): the node's interfaces from
// /etc/network/interfaces (its bridges and eth0; type bridge, any_bridge
// or any_local_bridge keeps the bridges, eth the rest), a bridge listed
// only when the caller may use it (canUseBridgeLocked), and the diff of a
// staged interfaces.new as the result attribute "changes".
func (s *Server) networkIndex(_ context.Context, rq *request) (any, error) {
	if err := s.checkNode(rq); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	node := rq.str("node")
	if err := s.checkClusterNodeLocked(node); err != nil {
		return nil, err
	}
	typ := rq.str("type")
	ifaces := []map[string]any{}
	if typ == "" || typ == "bridge" || typ == "any_bridge" || typ == "any_local_bridge" {
		for _, b := range s.members[node].bridges {
			if rq.authid == "root@pam" || s.canUseBridgeLocked(rq.authid, b) {
				ifaces = append(ifaces, map[string]any{"iface": b, "type": "bridge", "active": 1, "autostart": 1,
					"bridge_ports": "eth0", "bridge_stp": "off", "bridge_fd": "0", "method": "static", "families": []string{"inet"}})
			}
		}
	}
	if typ == "" || typ == "eth" {
		ifaces = append(ifaces, map[string]any{"iface": "eth0", "type": "eth", "active": 1, "method": "manual", "families": []string{"inet"}})
	}
	out := withAttribs{data: ifaces}
	if d := s.members[node].staged; d != "" {
		out.attribs = map[string]any{"changes": d}
	}
	return out, nil
}

// canUseBridgeLocked is pve-access-control RPCEnvironment.pm
// check_sdn_bridge for the zone localnetwork: SDN.Audit or SDN.Use on
// /sdn/zones/localnetwork/<bridge>, or on any VLAN of it that has an ACL
// entry (of any subject: the children of the bridge's node in the ACL
// tree).
func (s *Server) canUseBridgeLocked(authid, bridge string) bool {
	path := access.LocalZonePath + "/" + bridge
	paths := []string{path}
	for _, e := range s.acl {
		if vlan, ok := strings.CutPrefix(e.path, path+"/"); ok && vlan != "" && !strings.Contains(vlan, "/") && !slices.Contains(paths, e.path) {
			paths = append(paths, e.path)
		}
	}
	for _, p := range paths {
		if have := s.privilegesLocked(authid, p); have["SDN.Audit"] || have["SDN.Use"] {
			return true
		}
	}
	return false
}

// HoldReloads makes each node's network reload of an SDN apply stop while
// it holds the node's ifreload lock and has the node's dnsmasqs stopped,
// before it applies its zones, until
// release is called, and sends the node's name on held (buffered; extra
// sends are dropped): an apply whose reload is slow, as a real one is
// while it creates bridges and restarts dnsmasq. A reload of the node that
// starts meanwhile is lost, as ifupdown2's non-blocking lock makes it.
// Call it before the applies start.
func (s *Server) HoldReloads() (held <-chan string, release func()) {
	ch := make(chan string, 16)
	gate := make(chan struct{})
	var once sync.Once
	s.mu.Lock()
	s.hooks.reloadHeld = func(node string) {
		select {
		case ch <- node:
		default:
		}
		<-gate
	}
	s.mu.Unlock()
	return ch, func() { once.Do(func() { close(gate) }) }
}
