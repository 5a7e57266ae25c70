package firewall

import (
	"context"
	"testing"
)

func startGuard(t *testing.T, n *testNS, cfg Config) *Guard {
	t.Helper()
	g, err := New(cfg, WithNetNS(n.ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if err := g.Start(context.Background()); err != nil {
		t.Fatalf("start: %v", err)
	}
	return g
}

func TestApplyAndVerify(t *testing.T) {
	n := basicNode(t)
	g := startGuard(t, n, testConfig(t))
	if err := g.Verify(context.Background()); err != nil {
		t.Fatalf("verify after start: %v", err)
	}
	out, err := n.nft(t, "list", "table", "inet", TableName)
	if err != nil {
		t.Fatalf("nft list: %v\n%s", err, out)
	}
	t.Log(out)
}
