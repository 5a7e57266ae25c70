package stricttoml

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

type sample struct {
	Name string `toml:"name"`
	Sub  struct {
		Port int `toml:"port"`
	} `toml:"sub"`
}

func TestDecode(t *testing.T) {
	cases := []struct {
		name, doc string
		unknown   []string
		errHas    string
		want      sample
	}{
		{name: "defaults kept", doc: "", want: sample{Name: "def"}},
		{name: "values", doc: "name = \"x\"\n[sub]\nport = 7\n", want: func() sample { s := sample{Name: "x"}; s.Sub.Port = 7; return s }()},
		{name: "unknown keys", doc: "nmae = \"x\"\n[sub]\nprot = 1\n", unknown: []string{"nmae", "sub.prot"}},
		{name: "unknown table", doc: "[bogus]\na = 1\n", unknown: []string{"bogus", "bogus.a"}},
		{name: "syntax", doc: "name = \"x\"\nport = = 1\n", errHas: "line 2"},
		{name: "wrong type", doc: "name = 3\n", errHas: "name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := sample{Name: "def"}
			err := Decode(c.doc, &got)
			var uk *UnknownKeysError
			switch {
			case c.unknown != nil:
				if !errors.As(err, &uk) || !slices.Equal(uk.Keys, c.unknown) {
					t.Fatalf("err %v, want unknown keys %v", err, c.unknown)
				}
			case c.errHas != "":
				if err == nil || !strings.Contains(err.Error(), c.errHas) {
					t.Fatalf("err %v, want one naming %q", err, c.errHas)
				}
			default:
				if err != nil || got != c.want {
					t.Fatalf("got %+v %v, want %+v", got, err, c.want)
				}
			}
		})
	}
}

// FuzzDecode: no document makes Decode panic, and a document it accepts
// has no key outside the target.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{"", "name = \"x\"", "[sub]\nport = 1", "[[a]]\nb=1", "x = [1, {a=2}]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		var s sample
		if Decode(doc, &s) != nil {
			return
		}
		var m map[string]any
		if _, err := toml.Decode(doc, &m); err != nil {
			t.Fatalf("accepted a document the TOML parser refuses: %v", err)
		}
		for k, v := range m {
			switch k {
			case "name":
			case "sub":
				sub, ok := v.(map[string]any)
				if !ok {
					t.Fatalf("accepted sub = %v", v)
				}
				for sk := range sub {
					if sk != "port" {
						t.Fatalf("accepted unknown key sub.%s", sk)
					}
				}
			default:
				t.Fatalf("accepted unknown key %s", k)
			}
		}
	})
}
