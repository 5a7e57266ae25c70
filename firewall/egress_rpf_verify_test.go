package firewall

import (
	"strings"
	"testing"
)

// TestEgressRPFRulesVerifyAndRepair: the guard's source check on the
// resolver's and the proxy's ports (egress-rpf-resolver-udp/-tcp,
// egress-rpf-proxy in guest_in, "fib saddr . iif oif missing" before
// guest-established) reads back from the kernel as rendered, and a
// tampered one while the guard is down is a drift the next guard repairs
// to the rendered table: the rule deleted, the iif part of the fib
// dropped (which passes any source the node routes anywhere, the node's
// loose check), the drop made an accept, and the rule moved after
// guest-established (where an established 5-tuple through another
// bridge passes it).
func TestEgressRPFRulesVerifyAndRepair(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rule   string
		tamper func(r tamperedRule) [][]string
	}{
		{"rule deleted", "egress-rpf-proxy", func(r tamperedRule) [][]string {
			return [][]string{{"delete", "rule", "inet", TableName, chainGuestIn, "handle", r.handle}}
		}},
		{"fib without iif", "egress-rpf-resolver-udp", func(r tamperedRule) [][]string {
			return [][]string{{"replace", "rule", "inet", TableName, chainGuestIn, "handle", r.handle,
				strings.Replace(r.text, "fib saddr . iif oif missing", "fib saddr oif missing", 1)}}
		}},
		{"accept instead of drop", "egress-rpf-resolver-tcp", func(r tamperedRule) [][]string {
			return [][]string{{"replace", "rule", "inet", TableName, chainGuestIn, "handle", r.handle,
				strings.Replace(r.text, "counter drop", "counter accept", 1)}}
		}},
		{"after guest-established", "egress-rpf-resolver-udp", func(r tamperedRule) [][]string {
			return [][]string{
				{"delete", "rule", "inet", TableName, chainGuestIn, "handle", r.handle},
				{"add", "rule", "inet", TableName, chainGuestIn, "position", r.established, r.text},
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := map[string]ZoneEgress{"zb": {Mode: EgressAllowlist, Bridges: []string{"vnetB"}}}
			tamperAndRepair(t, pol, chainGuestIn, tc.rule, nil, tc.tamper)
		})
	}
}
