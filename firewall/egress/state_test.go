package egress

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/pve-inspect/pve-inspect/firewall"
)

func TestStateRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.json")
	st, err := LoadState(path)
	if err != nil || len(st.Zones()) != 0 {
		t.Fatalf("missing file: %v, %v", st.Zones(), err)
	}
	g := newFakeGuard()
	reg := NewRegistry(g, Rules{Mode: firewall.EgressOpen}, st)
	r, _ := Compile(Policy{Mode: "allowlist", Allow: []string{"pypi.org", "*.github.com", "203.0.113.0/24"}, Deny: []string{"203.0.113.9"}})
	n, _ := Compile(Policy{Mode: "none"})
	ctx := context.Background()
	if err := reg.Set(ctx, "za", "sb1", []string{"vneta"}, r); err != nil {
		t.Fatal(err)
	}
	if err := reg.Set(ctx, "zb", "sb2", []string{"vnetb"}, n); err != nil {
		t.Fatal(err)
	}
	if err := reg.Remove(ctx, "zb"); err != nil {
		t.Fatal(err)
	}
	again, err := LoadState(path)
	if err != nil {
		t.Fatal(err)
	}
	z := again.Zones()
	if len(z) != 1 || z["za"].Mode != firewall.EgressAllowlist || !slices.Equal(z["za"].Bridges, []string{"vneta"}) || len(z["za"].Deny) != 1 {
		t.Fatalf("reloaded %+v", z)
	}
	reg2 := NewRegistry(g, Rules{Mode: firewall.EgressOpen}, again)
	got, owner, err := reg2.For("vneta")
	if err != nil || owner != "sb1" || !got.AllowsName("api.github.com") || got.AllowsName("evil.org") {
		t.Errorf("restored rules: %+v %s %v", got, owner, err)
	}
	for name, content := range map[string]string{
		"garbage":     "{",
		"new version": `{"version": 2, "zones": []}`,
		"bad policy":  `{"version": 1, "zones": [{"zone": "z", "policy": {"mode": "closed"}}]}`,
	} {
		p := filepath.Join(t.TempDir(), "egress.json")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadState(p); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
}
