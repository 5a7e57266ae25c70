package firewall

import (
	"context"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestARPTableAppliedAndRepaired: Start puts table arp pve-inspect in
// force (owned, so another process cannot change it; golden: its rules as
// the kernel lists them), Verify reports an edit of the orphaned table,
// and the next guard's Start repairs it; guard remove takes it away.
func TestARPTableAppliedAndRepaired(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	g := startGuard(t, n, cfg)
	ctx := context.Background()
	list := func() string {
		out, err := n.nft(t, "list", "table", "arp", TableName)
		if err != nil {
			t.Fatalf("nft list: %v\n%s", err, out)
		}
		return tableFlagsRE.ReplaceAllString(prognameRE.ReplaceAllString(out, ""), "")
	}
	testkit.Golden(t, "arp-table.nft", []byte(list()))
	if out, err := n.nft(t, "delete", "table", "arp", TableName); err == nil {
		t.Fatalf("nft delete of the owned arp table succeeded: %s", out)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := n.nft(t, "flush", "chain", "arp", TableName, chainARPIn); err != nil {
		t.Fatalf("edit the orphan: %v %s", err, out)
	}
	g2, err := New(cfg, WithNetNS(n.Handle()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g2.Close() })
	if err := g2.Start(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if got := list(); !strings.Contains(got, `iifname "tap*"`) {
		t.Fatalf("the flushed chain was not repaired:\n%s", got)
	}
	if err := g2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := RemoveTable(ctx, cfg, WithNetNS(n.Handle())); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if out, err := n.nft(t, "list", "table", "arp", TableName); err == nil {
		t.Errorf("arp table still there after remove:\n%s", out)
	}
}
