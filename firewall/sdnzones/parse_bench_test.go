package sdnzones

import (
	"fmt"
	"strings"
	"testing"
)

// runningConfigDoc is a running config of n zones, each with one vnet and
// one subnet, as pve-network writes it.
func runningConfigDoc(n int) []byte {
	var zones, vnets, subnets []string
	for i := range n {
		z, v := fmt.Sprintf("z%04d", i), fmt.Sprintf("v%04d", i)
		zones = append(zones, fmt.Sprintf(`"%s":{"ipam":"pve","type":"simple","dhcp":"dnsmasq"}`, z))
		vnets = append(vnets, fmt.Sprintf(`"%s":{"alias":"net%d","type":"vnet","zone":"%s"}`, v, i, z))
		subnets = append(subnets, fmt.Sprintf(`"%s-10.%d.%d.0-24":{"gateway":"10.%d.%d.1","snat":1,"type":"subnet","vnet":"%s"}`,
			z, i/256, i%256, i/256, i%256, v))
	}
	return fmt.Appendf(nil, `{"controllers":{"ids":{}},"subnets":{"ids":{%s}},"version":%d,"vnets":{"ids":{%s}},"zones":{"ids":{%s}}}`,
		strings.Join(subnets, ","), n, strings.Join(vnets, ","), strings.Join(zones, ","))
}

// BenchmarkParse times Parse and, beside it in the same run, the
// encoding/json parser it replaced (parseReference), at 1, 500 and 2000
// zones.
func BenchmarkParse(b *testing.B) {
	for _, n := range []int{1, 500, 2000} {
		doc := runningConfigDoc(n)
		for _, p := range []struct {
			name  string
			parse func([]byte) (Snapshot, error)
		}{{"single-pass", Parse}, {"reference", parseReference}} {
			b.Run(fmt.Sprintf("%s/%d", p.name, n), func(b *testing.B) {
				for b.Loop() {
					s, err := p.parse(doc)
					if err != nil {
						b.Fatal(err)
					}
					if len(s.Zones) != n {
						b.Fatalf("%d zones, want %d", len(s.Zones), n)
					}
				}
			})
		}
	}
}
