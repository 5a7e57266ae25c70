package config

import (
	"errors"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestOneOwnerCannotFillNodeConns: node_conn_limit (131072) bounds the
// guest-originated tracked connections of every zone of every owner
// together (through the config, below the node's nf_conntrack_max); only
// the per-zone bound (conn_limit, 16384 before it was derived) stands
// between one owner and it. An owner may hold owner_sandboxes zones (a
// quarter of node_sandboxes 48: 12), each holding conn_limit tracked
// connections (UDP to the gateway's DHCP port 67 from fresh source ports,
// or half-open TCP to the resolver or proxy: confirmed entries, counted
// until their conntrack timeout); at 16384 eight of them fill
// node_conn_limit and every other tenant's new connections (DNS, DHCP
// renewals, the proxy, egress) are dropped. The node total must fit the
// owners at their share, as the other quotas' rule says (seats =
// node/share whole shares): an owner's zones together must hold at most
// node_conn_limit / 4 at the defaults.
func TestOneOwnerCannotFillNodeConns(t *testing.T) {
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

// TestConnLimitFitsNodeConnLimit: conn_limit left out is node_conn_limit
// / [egress] owners, and a file setting conn_limit x owners past
// node_conn_limit is refused naming guard.conn_limit.
func TestConnLimitFitsNodeConnLimit(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want int    // derived or kept conn_limit
		key  string // refused key, "" when accepted
	}{
		{"", 2048, ""},
		{"[guard]\nnode_conn_limit = 65536", 1024, ""},
		{"[api.caps]\nnode_sandboxes = 16\n[egress]\nowners = 32", 4096, ""},
		{"[guard]\nnode_conn_limit = 32768\n[egress]\nowners = 64", 512, ""},
		{"[api.caps]\nnode_sandboxes = 16", 4096, ""},
		{"[guard]\nconn_limit = 2048", 2048, ""},
		{"[guard]\nconn_limit = 100", 100, ""},
		{"[guard]\nconn_limit = 2049", 0, "guard.conn_limit"},
		{"[guard]\nconn_limit = 16384", 0, "guard.conn_limit"},
		{"[guard]\nconn_limit = 4096\n[api.caps]\nnode_sandboxes = 16\n[egress]\nowners = 33", 0, "guard.conn_limit"},
	} {
		c, err := Parse(tc.doc)
		if tc.key != "" {
			var ke *KeyError
			if !errors.As(err, &ke) || ke.Key != tc.key {
				t.Errorf("%q: %v, want a KeyError for %s", tc.doc, err, tc.key)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.doc, err)
			continue
		}
		if c.Guard.ConnLimit != tc.want {
			t.Errorf("%q: conn_limit %d, want %d", tc.doc, c.Guard.ConnLimit, tc.want)
		}
		if n := int64(c.Guard.ConnLimit) * int64(c.Egress.Owners); n > int64(c.Guard.NodeConnLimit) {
			t.Errorf("%q: conn_limit %d x owners %d = %d past node_conn_limit %d", tc.doc, c.Guard.ConnLimit, c.Egress.Owners, n, c.Guard.NodeConnLimit)
		}
	}
}
