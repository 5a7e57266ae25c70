package sdnzones

import (
	"errors"
	"os"
	"slices"
	"strings"
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
			if !refIDPattern.MatchString(z) || len(z) > 8 {
				t.Fatalf("zone id %q passed", z)
			}
			if len(vnets) == 0 {
				t.Fatalf("zone %s without vnets", z)
			}
			for _, v := range vnets {
				if !refIDPattern.MatchString(v) || len(v) > 8 {
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

// FuzzParseMatchesReference: the single-pass parser agrees with the
// encoding/json one it replaced (parse_ref_test.go) on every input: both
// fail, or both give the same version, zones and skipped vnets.
func FuzzParseMatchesReference(f *testing.F) {
	plugin, err := os.ReadFile("testdata/plugin.json")
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{string(plugin), "", " ", "null", "[]", "{}", "{} {}", `{"version":"3"}`, `{"version":1e3}`,
		`{"version":01}`, `{"version":-0}`, `{"zones":{"ids":{"z1":{}}},"vnets":{"ids":{"v1":{"zone":"z1"}}}}`,
		`{"zones":{"ids":{"z1":1,"z1":{}}},"vnets":{"ids":{"v1":{"zone":5,"zone":"z1"}}}}`,
		`{"zones":{"ids":{"z\u0031":{}}},"vnets":{"ids":{"v1":{"zo\u006ee":"z1","type":null}}}}`,
		`{"vnets":{"ids":{"v1":{"zone":null}}}}`, `{"zones":null,"vnets":{"ids":null}}`, `{"zones":[],"vnets":{}}`,
		`{"a":[1,2.5,-3e-2,true,false,null,"\"\\\/\b\f\n\r\t"],"zones":{"x":{"ids":5},"ids":{}}}`,
		"{\"a\":\"\xff\"}", "{\"a\":\"\x01\"}", `{"a":"\x"}`, `{"a":[1,]}`, `{"a":1,}`, `{"a" 1}`, `[[[[`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Parse(data)
		want, refErr := parseReference(data)
		if (err == nil) != (refErr == nil) {
			t.Fatalf("Parse: %v, the reference: %v", err, refErr)
		}
		if err != nil {
			return
		}
		if got.Version != want.Version || !Equal(got.Zones, want.Zones) || !slices.Equal(got.Skipped, want.Skipped) {
			t.Fatalf("Parse: %+v, the reference: %+v", got, want)
		}
	})
}

// TestParseDeepNesting: a document nested past encoding/json's depth
// limit is refused, as the reference refuses it, without exhausting the
// stack.
func TestParseDeepNesting(t *testing.T) {
	for _, n := range []int{maxDepth - 1, maxDepth + 1, MaxSize / 2} {
		doc := `{"a":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}`
		if len(doc) > MaxSize {
			doc = doc[:MaxSize]
		}
		_, err := Parse([]byte(doc))
		_, refErr := parseReference([]byte(doc))
		if (err == nil) != (refErr == nil) {
			t.Errorf("depth %d: Parse: %v, the reference: %v", n, err, refErr)
		}
		if n > maxDepth && err == nil {
			t.Errorf("depth %d accepted", n)
		}
	}
}
