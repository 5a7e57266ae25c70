package config

import (
	"errors"
	"testing"
)

// TestEgressOwnersCoverNodeSandboxes: the egress node totals are
// share * [egress] owners, "so that every owner at its share fits"; an
// owner is a sandbox. Nothing ties owners to how many sandboxes the node
// admits, a config with node_sandboxes past owners (or 0, unlimited: the shipped
// default), the owners past `owners` at their share (one tenant's many
// small sandboxes) hold every node total and each other tenant's
// sandbox is refused DNS, proxy and learned addresses (limit "node"),
// is refused; owners left out is node_sandboxes + ForeignZoneOwners.
func TestEgressOwnersCoverNodeSandboxes(t *testing.T) {
	for _, tc := range []struct{ name, toml string }{
		{"node_sandboxes past owners", "[api.caps]\nnode_sandboxes = 200\n[egress]\nowners = 64"},
		{"unlimited sandboxes, default owners", "[api.caps]\nnode_sandboxes = 0\n"},
		{"unlimited sandboxes, explicit owners", "[api.caps]\nnode_sandboxes = 0\n[egress]\nowners = 64"},
		{"owners one short", "[api.caps]\nnode_sandboxes = 33\n[egress]\nowners = 32\nmax_learned = 512"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.toml)
			var ke *KeyError
			if !errors.As(err, &ke) {
				t.Fatalf("Parse accepted a node that admits more sandboxes than its egress totals hold at their share: err %v", err)
			}
		})
	}
	for _, tc := range []struct {
		toml string
		want int
	}{
		{"", 48 + ForeignZoneOwners},
		{"[api.caps]\nnode_sandboxes = 10", 10 + ForeignZoneOwners},
		{"[api.caps]\nnode_sandboxes = 32\n[egress]\nowners = 32\nmax_learned = 512", 32},
	} {
		c, err := Parse(tc.toml)
		if err != nil {
			t.Fatalf("%q: %v", tc.toml, err)
		}
		if c.Egress.Owners != tc.want {
			t.Errorf("%q: owners %d, want %d", tc.toml, c.Egress.Owners, tc.want)
		}
	}
}
