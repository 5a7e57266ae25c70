package sdnzones

import (
	"errors"
	"os"
	"testing"
)

// FuzzParse: any input either parses into names that are valid interface
// names of pve-network's id format, each vnet in one zone only, or fails
// with a *ParseError; it never panics.
func FuzzParse(f *testing.F) {
	plugin, err := os.ReadFile("testdata/plugin.json")
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{string(plugin), "", "{}", `{"version":"3"}`, `{"zones":{"ids":{"z1":{}}},"vnets":{"ids":{"v1":{"zone":"z1"}}}}`,
		`{"vnets":{"ids":{"v1":{"zone":null}}}}`, `{"zones":null,"vnets":{"ids":null}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error is not a *ParseError: %v", err)
			}
			return
		}
		seen := map[string]string{}
		for z, vnets := range s.Zones {
			if !idPattern.MatchString(z) || len(z) > 8 {
				t.Fatalf("zone id %q passed", z)
			}
			if len(vnets) == 0 {
				t.Fatalf("zone %s without vnets", z)
			}
			for _, v := range vnets {
				if !idPattern.MatchString(v) || len(v) > 8 {
					t.Fatalf("vnet id %q passed", v)
				}
				if other, dup := seen[v]; dup {
					t.Fatalf("vnet %s in zones %s and %s", v, other, z)
				}
				seen[v] = z
			}
		}
	})
}
