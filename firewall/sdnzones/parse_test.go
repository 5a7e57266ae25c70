package sdnzones

import (
	"errors"
	"os"
	"reflect"
	"testing"
)

func TestParse(t *testing.T) {
	plugin, err := os.ReadFile("testdata/plugin.json")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		doc     string
		version int64
		zones   map[string][]string
		skipped []string
		bad     bool
	}{
		{name: "plugin zones as pve-network writes them", doc: string(plugin), version: 7,
			zones: map[string][]string{"abc123z": {"abc123v0", "abc123v1"}, "xyz456z": {"xyz456v0"}}},
		{name: "empty file: sdn never applied", doc: "", zones: map[string][]string{}},
		{name: "white space only", doc: " \n", zones: map[string][]string{}},
		{name: "empty object", doc: "{}", zones: map[string][]string{}},
		{name: "empty ids after deleting everything", doc: `{"version":3,"zones":{"ids":{}},"vnets":{"ids":{}}}`, version: 3, zones: map[string][]string{}},
		{name: "version as a string", doc: `{"version":"12"}`, version: 12, zones: map[string][]string{}},
		{name: "vnet without zone stays isolated", doc: `{"zones":{"ids":{"z1":{"type":"simple"}}},"vnets":{"ids":{"v1":{"type":"vnet"}}}}`,
			zones: map[string][]string{}, skipped: []string{"v1: no zone"}},
		{name: "vnet of an undefined zone stays isolated", doc: `{"zones":{"ids":{}},"vnets":{"ids":{"v1":{"type":"vnet","zone":"gone"}}}}`,
			zones: map[string][]string{}, skipped: []string{"v1: zone gone is not defined"}},
		{name: "zone without vnets is left out", doc: `{"zones":{"ids":{"z1":{"type":"simple"}}}}`, zones: map[string][]string{}},
		{name: "keys match exactly, as in perl", doc: `{"Vnets":{"ids":{"v1":{"zone":"z1"}}},"zones":{"ids":{"z1":{}}},"vnets":{"ids":{"v2":{"Zone":"z1"}}}}`,
			zones: map[string][]string{}, skipped: []string{"v2: no zone"}},
		{name: "garbled", doc: `{"version":7,"zones":{"ids":{"abc`, bad: true},
		{name: "not an object", doc: `[1,2]`, bad: true},
		{name: "trailing data", doc: `{} {}`, bad: true},
		{name: "negative version", doc: `{"version":-1}`, bad: true},
		{name: "fractional version", doc: `{"version":1.5}`, bad: true},
		{name: "vnet id too long", doc: `{"zones":{"ids":{"z1":{}}},"vnets":{"ids":{"abcdefghi":{"zone":"z1"}}}}`, bad: true},
		{name: "vnet id with a wildcard", doc: `{"zones":{"ids":{"z1":{}}},"vnets":{"ids":{"vnet*":{"zone":"z1"}}}}`, bad: true},
		{name: "vnet id with a dash", doc: `{"zones":{"ids":{"z1":{}}},"vnets":{"ids":{"vm-br0":{"zone":"z1"}}}}`, bad: true},
		{name: "zone id too short", doc: `{"zones":{"ids":{"z":{}}}}`, bad: true},
		{name: "zone name of a vnet is not an id", doc: `{"zones":{"ids":{"z1":{}}},"vnets":{"ids":{"v1":{"zone":"z 1"}}}}`, bad: true},
		{name: "vnet entry not an object", doc: `{"zones":{"ids":{"z1":{}}},"vnets":{"ids":{"v1":"z1"}}}`, bad: true},
		{name: "zone entry not an object", doc: `{"zones":{"ids":{"z1":1}}}`, bad: true},
		{name: "vnet of another type", doc: `{"zones":{"ids":{"z1":{}}},"vnets":{"ids":{"v1":{"type":"subnet","zone":"z1"}}}}`, bad: true},
		{name: "zone of the wrong JSON type", doc: `{"zones":{"ids":{"z1":{}}},"vnets":{"ids":{"v1":{"zone":5}}}}`, bad: true},
		{name: "ids not an object", doc: `{"vnets":{"ids":[]}}`, bad: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Parse([]byte(c.doc))
			if c.bad {
				var pe *ParseError
				if !errors.As(err, &pe) {
					t.Fatalf("want a *ParseError, got %v (%+v)", err, s)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Version != c.version || !reflect.DeepEqual(s.Zones, c.zones) || !reflect.DeepEqual(s.Skipped, c.skipped) {
				t.Errorf("got version %d zones %v skipped %q, want %d %v %q", s.Version, s.Zones, s.Skipped, c.version, c.zones, c.skipped)
			}
		})
	}
}

func TestParseTooLarge(t *testing.T) {
	big := make([]byte, MaxSize+1)
	for i := range big {
		big[i] = ' '
	}
	if _, err := Parse(big); err == nil {
		t.Fatal("a document over MaxSize parsed")
	}
}

// TestParseVnetHugeNumber: a vnet field holding a number no float64 holds
// is no reason to refuse the document (its value is never read).
func TestParseVnetHugeNumber(t *testing.T) {
	s, err := Parse([]byte(`{"zones":{"ids":{"z1":{}}},"vnets":{"ids":{"v1":{"zone":"z1","alias":1e999}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Zones["z1"]; len(got) != 1 || got[0] != "v1" {
		t.Fatalf("zones %v, want z1: [v1]", s.Zones)
	}
}
