package config

import (
	"errors"
	"testing"
)

// TestReview2EgressOwnersFitNode (review2): the egress node totals are
// share * [egress] owners, "so that every owner at its share fits"; an
// owner is a sandbox. Nothing ties owners to how many sandboxes the node
// admits: with node_sandboxes past owners (or 0, unlimited: the shipped
// default), the owners past `owners` at their share (one tenant's many
// small sandboxes) hold every node total and each other tenant's
// sandbox is refused DNS, proxy and learned addresses (limit "node").
func TestReview2EgressOwnersFitNode(t *testing.T) {
	for _, tc := range []struct{ name, toml string }{
		{"node_sandboxes past owners", "[api.caps]\nnode_sandboxes = 200\n[egress]\nowners = 64"},
		{"unlimited sandboxes, default owners", "[api.caps]\nnode_sandboxes = 0\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.toml)
			var ke *KeyError
			if !errors.As(err, &ke) {
				t.Fatalf("Parse accepted a node that admits more sandboxes than its egress totals hold at their share: err %v", err)
			}
		})
	}
}
