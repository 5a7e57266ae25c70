package config

import (
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestReview3OneOwnerCannotFillNodeConns: the guard's node-wide bound on
// guest-originated tracked connections (@node_conns, node_conn_limit
// 131072) is one counter for every zone of every owner; only the
// per-zone bound (conn_limit 16384) stands between one owner and it.
// An owner may hold owner_sandboxes zones (a quarter of node_sandboxes
// 48: 12), so one owner's 8 sandboxes, each holding conn_limit tracked
// connections (UDP to the gateway's DHCP port 67 from fresh source ports,
// or half-open TCP to the resolver or proxy: confirmed entries, counted
// until their conntrack timeout), fill node_conn_limit, and from then
// every other tenant's new connections (DNS, DHCP renewals, the proxy,
// egress) are dropped by node-flood-conns. The node total must fit the
// owners at their share, as the other quotas' rule says (seats =
// node/share whole shares): an owner's zones together must hold at most
// node_conn_limit / 4 at the defaults (or the count must be per owner).
func TestReview3OneOwnerCannotFillNodeConns(t *testing.T) {
	c := Default()
	caps := sandbox.Caps{NodeSandboxes: c.API.Caps.NodeSandboxes, OwnerSandboxes: c.API.Caps.OwnerSandboxes}.WithOwnerDefaults()
	owner := int64(caps.OwnerSandboxes) * int64(c.Guard.ConnLimit)
	node := int64(c.Guard.NodeConnLimit)
	t.Logf("owner_sandboxes %d x conn_limit %d = %d tracked connections one owner may hold; node_conn_limit %d",
		caps.OwnerSandboxes, c.Guard.ConnLimit, owner, node)
	if owner >= node {
		t.Errorf("one owner's zones may hold %d tracked connections, not below the node-wide bound %d: one tenant drops every other tenant's new connections", owner, node)
	}
	if 4*owner > node {
		t.Errorf("four owners at their share hold %d tracked connections, past node_conn_limit %d (seats of the quota rule do not fit)", 4*owner, node)
	}
}
