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
	ruleRE := regexp.MustCompile(`(?m)^\s*(.*) # handle (\d+)$`)
	for _, tc := range []struct {
		name   string
		tamper func(handle string) [][]string
	}{
		{"fib without iif", func(h string) [][]string {
			return [][]string{{"replace", "rule", "inet", TableName, chainEgressNAT, "handle", h,
				`iifname @egress_dns_zone udp dport 53 fib daddr type local counter redirect to :15353 comment "egress-dns-zone-udp"`}}
		}},
		{"rule deleted", func(h string) [][]string {
			return [][]string{{"delete", "rule", "inet", TableName, chainEgressNAT, "handle", h}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := basicNode(t)
			cfg := testConfig(t)
			pol := map[string]ZoneEgress{"zb": {Mode: EgressOpen, Bridges: []string{"vnetB"}}}
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
			if got := setElements(t, n, SetEgressDNSZone); got != `"vnetB"` {
				t.Fatalf("egress_dns_zone: %q, want vnetB", got)
			}
			if err := g.Verify(ctx); err != nil {
				t.Fatalf("verify of the rendered table: %v", err)
			}
			want := listTable(t, n)
			out, err := n.nft(t, "-a", "list", "chain", "inet", TableName, chainEgressNAT)
			if err != nil {
				t.Fatal(err)
			}
			handle := ""
			for _, m := range ruleRE.FindAllStringSubmatch(out, -1) {
				if strings.Contains(m[1], `"egress-dns-zone-udp"`) {
					handle = m[2]
				}
			}
			if handle == "" {
				t.Fatalf("no egress-dns-zone-udp rule:\n%s", out)
			}
			if err := g.Close(); err != nil {
				t.Fatal(err)
			}
			for _, args := range tc.tamper(handle) {
				if out, err := n.nft(t, args...); err != nil {
					t.Fatalf("tamper %v: %v\n%s", args, err, out)
				}
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
		})
	}
}
