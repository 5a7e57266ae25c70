package firewall

import (
	"context"
	"regexp"
	"strings"
	"testing"
)

// TestOpenDNSZoneRulesVerifyAndRepair: the redirect of a daemon-own open
// zone's DNS to the zone's address (egress-dns-zone-udp/tcp, with "fib
// daddr . iif type local" in the NAT chain) reads back from the kernel as
// rendered (Verify passes), and a tampered rule (the iif part of the fib
// dropped, which would redirect DNS to every node address; the rule
// deleted) while the guard is down is a drift the next guard repairs to
// the rendered table (the owner flag refuses every edit while one runs).
func TestOpenDNSZoneRulesVerifyAndRepair(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(r tamperedRule) [][]string
	}{
		{"fib without iif", func(r tamperedRule) [][]string {
			return [][]string{{"replace", "rule", "inet", TableName, chainEgressNAT, "handle", r.handle,
				`iifname @egress_dns_zone udp dport 53 fib daddr type local counter redirect to :15353 comment "egress-dns-zone-udp"`}}
		}},
		{"rule deleted", func(r tamperedRule) [][]string {
			return [][]string{{"delete", "rule", "inet", TableName, chainEgressNAT, "handle", r.handle}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := map[string]ZoneEgress{"zb": {Mode: EgressOpen, Bridges: []string{"vnetB"}}}
			tamperAndRepair(t, pol, chainEgressNAT, "egress-dns-zone-udp", func(t *testing.T, n *testNS) {
				if got := setElements(t, n, SetEgressDNSZone); got != `"vnetB"` {
					t.Fatalf("egress_dns_zone: %q, want vnetB", got)
				}
			}, tc.tamper)
		})
	}
}

// tamperedRule is what a tamper of tamperAndRepair gets: the rendered
// rule (nft syntax with its comment), its kernel handle, and the handle
// of its chain's guest-established rule ("" when there is none).
type tamperedRule struct {
	text, handle, established string
}

// tamperAndRepair starts a guard with egress policies pol on the basic
// node, checks that it verifies (and check, if not nil, on the node),
// closes it, runs the nft commands tamper makes for rule of chain,
// checks that Inspect reports a drift, and that the next guard repairs
// the table to the rendered one.
func tamperAndRepair(t *testing.T, pol map[string]ZoneEgress, chain, rule string, check func(*testing.T, *testNS), tamper func(tamperedRule) [][]string) {
	t.Helper()
	ruleRE := regexp.MustCompile(`(?m)^\s*(.*) # handle (\d+)$`)
	n := basicNode(t)
	cfg := testConfig(t)
	start := func() *Guard {
		g, err := New(cfg, WithNetNS(n.Handle()), WithEgress(pol))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.Close() })
		if err := g.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		return g
	}
	ctx := context.Background()
	g := start()
	if check != nil {
		check(t, n)
	}
	if err := g.Verify(ctx); err != nil {
		t.Fatalf("verify of the rendered table: %v", err)
	}
	var tr tamperedRule
	for _, c := range g.Desired().Chains {
		for _, r := range c.Rules {
			if c.Name == chain && r.Comment == rule {
				tr.text = r.Text + ` comment "` + r.Comment + `"`
			}
		}
	}
	if tr.text == "" {
		t.Fatalf("no %s rule rendered in %s", rule, chain)
	}
	want := listTable(t, n)
	out, err := n.nft(t, "-a", "list", "chain", "inet", TableName, chain)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ruleRE.FindAllStringSubmatch(out, -1) {
		switch {
		case strings.Contains(m[1], `"`+rule+`"`):
			tr.handle = m[2]
		case strings.Contains(m[1], `"guest-established"`):
			tr.established = m[2]
		}
	}
	if tr.handle == "" {
		t.Fatalf("no %s rule:\n%s", rule, out)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	for _, args := range tamper(tr) {
		if out, err := n.nft(t, args...); err != nil {
			t.Fatalf("tamper %v: %v\n%s", args, err, out)
		}
	}
	if got := listTable(t, n); got == want {
		t.Fatalf("the tamper changed nothing:\n%s", got)
	}
	st, err := Inspect(ctx, cfg, WithNetNS(n.Handle()), WithEgress(pol))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Drifts) == 0 {
		t.Fatalf("the tampered rule is no drift:\n%s", listTable(t, n))
	}
	g = start()
	if err := g.Verify(ctx); err != nil {
		t.Errorf("verify after repair: %v", err)
	}
	if got := listTable(t, n); got != want {
		t.Errorf("repaired table differs:\n%s\nwant\n%s", got, want)
	}
}
