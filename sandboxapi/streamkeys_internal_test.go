package sandboxapi

import (
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
)

// TestStreamOwnerKeys: for the event stream caps every token bound to no
// owner is an owner of its own and the local socket is one too, under
// keys no token name or owner can spell: two unbound tokens at their
// share leave the local CLI its streams, and a token named "local" does
// not share the local socket's per-token count. Before, unbound tokens and
// the local socket were all the owner "-", and the local socket the token
// "local".
func TestStreamOwnerKeys(t *testing.T) {
	var (
		local    = principal{name: "local", local: true}
		named    = principal{name: "local"} // an unbound token named local
		root     = principal{name: "root"}
		ops      = principal{name: "ops"}
		alice1   = principal{name: "a1", owner: "alice"}
		alice2   = principal{name: "a2", owner: "alice"}
		tokenOwn = principal{name: "x", owner: "token"}
	)
	for _, tc := range []struct {
		p            principal
		owner, token string
	}{
		{local, localStreamKey, localStreamKey},
		{named, "token:local", "local"},
		{root, "token:root", "root"},
		{alice1, "alice", "a1"},
		{alice2, "alice", "a2"},
		{tokenOwn, "token", "x"},
	} {
		owner, token := streamKeys(tc.p)
		if owner != tc.owner || token != tc.token {
			t.Errorf("%+v: keys %q, %q; want %q, %q", tc.p, owner, token, tc.owner, tc.token)
		}
		for _, k := range []string{owner, token} {
			if k == localStreamKey && !tc.p.local || k == "token:"+tc.p.name && tc.p.owner != "" {
				t.Errorf("%+v: key %q is another kind's", tc.p, k)
			}
		}
	}
	if auth.ValidName(localStreamKey) || auth.ValidName("token:root") {
		t.Error("a stream key of the local socket or of an unbound token is a valid token name or owner")
	}

	// Two unbound tokens and a token named local, each at its cap, leave
	// the local socket all of its own.
	c := newStreamCount(StreamLimits{PerToken: 2, PerOwner: 2, Node: 100})
	for _, p := range []principal{root, root, ops, ops, named, named} {
		if _, prob := c.take(p); prob != nil {
			t.Fatalf("%+v: %s", p, prob.Detail)
		}
	}
	if _, prob := c.take(root); prob == nil {
		t.Error("an unbound token took a stream past its cap")
	}
	for i := range 2 {
		if _, prob := c.take(local); prob != nil {
			t.Errorf("local stream %d refused: %s", i+1, prob.Detail)
		}
	}
}
