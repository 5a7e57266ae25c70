package pveemu

import (
	"fmt"

	"github.com/pve-inspect/pve-inspect/pveapi/access"
)

// AccessSetup varies what ApplyAccessSetup creates, as pve-access-setup's
// environment does.
type AccessSetup struct {
	// Pool is PVE_INSPECTD_POOL ("": access.DefaultPool). An existing pool
	// is kept.
	Pool string
	// Templates is PVE_INSPECTD_TEMPLATES: the template VMIDs (VMs or
	// containers) granted access.RoleTemplate; each must exist. The
	// paths their NICs on host bridges are checked on (a clone's
	// check_bridge_access) are granted access.RoleBridge, as the script
	// reads them from the templates' configs.
	Templates []int
	// Storages is PVE_INSPECTD_STORAGE (none: access.DefaultStorage); the
	// transfer storage, when named, is added to the pool too.
	Storages []string
	// Node is the node the script runs on ("": the server's primary
	// node): its grants name it. On a cluster the script runs once per
	// node; the roles, user and pool are shared and kept.
	Node string
	// Transfer is PVE_INSPECTD_TRANSFER_STORAGE: the disk transfer
	// storage added to the pool and granted access.RoleTransfer ("":
	// none, as the script does by default).
	Transfer string
	// Token is the token's name ("": access.TokenName of the node, as
	// pve-access-setup names it). Each node's daemon has a token of its
	// own, so that setting up one node does not replace the secret
	// another node's daemon holds.
	Token string
}

// ApplyAccessSetup creates what packaging/deb/pve-access-setup creates on
// this node, from the same table (pveapi/access): its roles, its user, the
// pool with its storages, the privilege-separated token and the ACL
// entries for the user and the token (the templates' NIC bridges read
// from their configs). It returns the token's full id and secret. The
// tests of the daemon authenticate with it and with nothing broader.
func (s *Server) ApplyAccessSetup(a AccessSetup) (tokenID, secret string, err error) {
	pool := a.Pool
	if pool == "" {
		pool = access.DefaultPool
	}
	bridges, err := s.templateBridges(a.Templates)
	if err != nil {
		return "", "", fmt.Errorf("access setup: %w", err)
	}
	for _, r := range access.Roles() {
		if err := s.AddRole(r.Name, r.Privs); err != nil {
			return "", "", fmt.Errorf("access setup: %w", err)
		}
	}
	s.mu.Lock()
	_, userExists := s.users[access.User]
	s.mu.Unlock()
	if !userExists {
		if err := s.AddUser(access.User, ""); err != nil {
			return "", "", fmt.Errorf("access setup: %w", err)
		}
	}
	s.mu.Lock()
	exists := s.pools[pool] != nil
	s.mu.Unlock()
	if !exists {
		if err := s.AddPool(pool, "pve-inspectd sandboxes"); err != nil {
			return "", "", fmt.Errorf("access setup: %w", err)
		}
	}
	setup := access.Setup{Pool: pool, Templates: a.Templates, Bridges: bridges, Transfer: a.Transfer}
	for _, sid := range setup.PoolStorages(a.Storages...) {
		if err := s.AddPoolStorage(pool, sid); err != nil {
			return "", "", fmt.Errorf("access setup: %w", err)
		}
	}
	node, token := a.Node, a.Token
	if node == "" {
		node = s.node
	}
	if token == "" {
		token = access.TokenName(node)
	}
	tokenID, secret, err = s.AddToken(access.User, token, true)
	if err != nil {
		return "", "", fmt.Errorf("access setup: %w", err)
	}
	setup.Node = node
	for _, e := range setup.ACLEntries() {
		for _, who := range []string{access.User, tokenID} {
			if err := s.SetACL(e.Path, who, e.Role, e.Propagate); err != nil {
				return "", "", fmt.Errorf("access setup: grant %s on %s to %s: %w", e.Role, e.Path, who, err)
			}
		}
	}
	return tokenID, secret, nil
}

// templateBridges returns the paths below access.LocalZonePath the NICs of
// the templates on host bridges are checked on, as pve-access-setup reads
// them (`qm config`, `pct config` for a container template, and the SDN
// vnets of vnets.cfg).
func (s *Server) templateBridges(ids []int) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var confs []map[string]string
	for _, id := range ids {
		v := s.vms[id]
		if v == nil {
			return nil, fmt.Errorf("template %d: neither qm config nor pct config reads it (Configuration file 'nodes/%s/lxc/%d.conf' does not exist)", id, s.node, id)
		}
		confs = append(confs, v.conf)
	}
	local, _ := access.TemplateBridges(confs, s.vnetZoneLocked)
	return local, nil
}

// vnetZoneLocked is the zone of vnet in vnets.cfg (the pending
// generation), "" when it is no vnet.
func (s *Server) vnetZoneLocked(vnet string) string {
	return s.sdn.pending.vnets[vnet]["zone"]
}

// EnableClusterFirewall turns the cluster firewall on, as root does once
// on a node (`pvesh set /cluster/firewall/options --enable 1`): the
// daemon's token may only read the switch.
func (s *Server) EnableClusterFirewall() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fw["cluster"].options["enable"] = "1"
}
