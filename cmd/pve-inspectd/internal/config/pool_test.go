package config

import (
	"strings"
	"testing"
	"time"
)

func TestPoolSection(t *testing.T) {
	const shape = "[[pool.shapes]]\nname = \"small\"\ntemplate = \"debian\"\ntarget = 4\nmax_age = \"6h\"\n"
	for _, tc := range []struct {
		name string
		doc  string
		key  string // the key the error names; "" = valid
		msg  string
	}{
		{"defaults", "", "", ""},
		{"one shape", shape, "", ""},
		{"inline shapes", "[pool]\nshapes = [{ name = \"a\", template = \"debian\", target = 1 }, { name = \"b\", template = \"debian\", cores = 2, target = 1 }]\n", "", ""},
		{"two networks", shape + "networks = [\"net0\", \"net1\"]\negress = \"allowlist\"\n", "", ""},
		{"short interval", "[pool]\ninterval = \"100ms\"\n", "pool.interval", "at least 1s"},
		{"bad template", "[[pool.shapes]]\nname = \"x\"\ntemplate = \"../x\"\n", "pool.shapes[0].template", "template name"},
		{"bad name", "[[pool.shapes]]\nname = \"Big\"\ntemplate = \"debian\"\n", "pool.shapes", "want [a-z]"},
		{"same name", shape + shape, "pool.shapes", "name used twice"},
		{"same requests", shape + "[[pool.shapes]]\nname = \"other\"\ntemplate = \"debian\"\n", "pool.shapes", "same requests"},
		{"bad egress", shape + "egress = \"closed\"\n", "pool.shapes", "open, none or allowlist"},
		{"negative target", "[[pool.shapes]]\nname = \"x\"\ntemplate = \"debian\"\ntarget = -1\n", "pool.shapes", "negative"},
		{"unknown key", shape + "size = 3\n", "pool.shapes", "unknown"},
		{"containers", "[api]\ncontainers = true\n" + shape + "kind = \"lxc\"\n", "", ""},
		{"one template name of each kind", "[api]\ncontainers = true\n" + shape + "[[pool.shapes]]\nname = \"ct\"\nkind = \"lxc\"\ntemplate = \"debian\"\n", "", ""},
		{"containers off", shape + "kind = \"lxc\"\n", "pool.shapes[0].kind", "[api] containers is off"},
		{"bad kind", shape + "kind = \"qemu\"\n", "pool.shapes", `kind "qemu": want "vm" (default) or "lxc"`},
		{"same requests of a kind", "[api]\ncontainers = true\n" + shape + "kind = \"lxc\"\n[[pool.shapes]]\nname = \"other\"\nkind = \"lxc\"\ntemplate = \"debian\"\ntarget = 1\n",
			"pool.shapes", "same requests"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse(tc.doc)
			if tc.key == "" {
				if err != nil {
					t.Fatal(err)
				}
				shapes, err := c.Pool.EngineShapes()
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range shapes {
					if s.Cores < 1 || s.MemoryMiB < 1 || len(s.Networks) == 0 || s.Egress == "" || s.Kind == "" {
						t.Errorf("shape %+v: defaults not filled", s)
					}
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("%q: error %v, want one naming %q and saying %q", tc.doc, err, tc.key, tc.msg)
			}
		})
	}
	c, err := Parse(shape)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := c.Pool.EngineShapes()
	if len(s) != 1 || s[0].MaxAge != 6*time.Hour || s[0].Target != 4 || s[0].MemoryMiB != 1024 || s[0].Networks[0] != "net0" || s[0].Egress != "open" || s[0].Kind != "vm" {
		t.Errorf("shape %+v", s)
	}
}
