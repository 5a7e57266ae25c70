package config

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/lockdown/halt"
)

// shippedPath is the configuration file the Debian package installs as a
// conffile.
var shippedPath = filepath.Join("..", "..", "..", "..", "packaging", "deb", "config.toml")

func readShipped(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(shippedPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestShippedParses: the file as shipped (every key commented out) is
// valid, and means the defaults.
func TestShippedParses(t *testing.T) {
	c, err := Parse(readShipped(t))
	if err != nil {
		t.Fatalf("shipped config.toml: %v", err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Fatalf("shipped config.toml is not the defaults:\n got %+v\nwant %+v", c, Default())
	}
}

// tomlKeys walks the toml tags of a struct type: "section.key" for every
// field of every section.
func tomlKeys(t reflect.Type, prefix string) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("toml"), ",")[0]
		if tag == "" || tag == "-" {
			continue
		}
		key := tag
		if prefix != "" {
			key = prefix + "." + tag
		}
		if f.Type.Kind() == reflect.Struct {
			out = append(out, tomlKeys(f.Type, key)...)
			continue
		}
		out = append(out, key)
	}
	return out
}

// documented returns section.key for every "# key = value" line of the
// shipped file (the commented-out defaults), under its [section].
func documented(doc string) map[string]bool {
	section := ""
	secRE := regexp.MustCompile(`^\[([a-z0-9_.]+)\]\s*$`)
	keyRE := regexp.MustCompile(`^#\s?([a-z0-9_]+) = `)
	out := map[string]bool{}
	for _, line := range strings.Split(doc, "\n") {
		if m := secRE.FindStringSubmatch(line); m != nil {
			section = m[1]
			out[section] = true
			continue
		}
		if m := keyRE.FindStringSubmatch(line); m != nil && section != "" {
			out[section+"."+m[1]] = true
		}
	}
	return out
}

// TestShippedDocumentsEveryKey: every key of Config (walked through its toml
// tags) appears in the shipped file as a commented-out "key = default" line
// under its section, and the file documents no key Config lacks. A new
// section or key without its documentation fails here.
func TestShippedDocumentsEveryKey(t *testing.T) {
	doc := documented(readShipped(t))
	keys := tomlKeys(reflect.TypeOf(Config{}), "")
	if len(keys) < 10 {
		t.Fatalf("walked only %d keys: %q", len(keys), keys)
	}
	want := map[string]bool{}
	for _, k := range keys {
		want[k] = true
		want[k[:strings.LastIndex(k, ".")]] = true // its section
		if !doc[k] {
			t.Errorf("key %s is not documented in %s (add a commented-out `# %s = <default>` line under [%s])",
				k, shippedPath, k[strings.LastIndex(k, ".")+1:], k[:strings.LastIndex(k, ".")])
		}
	}
	for k := range doc {
		if !want[k] {
			t.Errorf("%s documents %s, which Config does not have", shippedPath, k)
		}
	}
}

// TestShippedDefaultsAreReal: uncommenting every documented line keeps the
// file valid and changes nothing, so the documented defaults are the real
// ones (node.id aside: it is the host name).
func TestShippedDefaultsAreReal(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	keyRE := regexp.MustCompile(`^#\s?([a-z0-9_]+ = .*)$`)
	for _, line := range strings.Split(readShipped(t), "\n") {
		if m := keyRE.FindStringSubmatch(line); m != nil {
			line = m[1]
			if strings.HasPrefix(line, "id = ") {
				line = "id = " + `"` + host + `"`
			}
		}
		b.WriteString(line + "\n")
	}
	c, err := Parse(b.String())
	if err != nil {
		t.Fatalf("uncommented defaults do not parse: %v\n%s", err, b.String())
	}
	d := Default()
	norm := func(c *Config) {
		// An empty list or table written out equals the absent default.
		g := &c.Guard
		for _, p := range []*[]string{&g.Metadata4, &g.Metadata6, &g.Private4Allow, &g.Trusted} {
			if len(*p) == 0 {
				*p = nil
			}
		}
		if len(g.Zones) == 0 {
			g.Zones = nil
		}
	}
	norm(&c)
	norm(&d)
	// [halt] documents the defaults of package lockdown/halt, which the
	// empty values stand for.
	wantHalt := HaltSection{Units: halt.DefaultUnits(), StateFile: halt.DefaultStateFile, Transport: string(halt.TransportAuto)}
	if !reflect.DeepEqual(c.Halt, wantHalt) {
		t.Fatalf("documented [halt] = %+v, package halt's defaults are %+v", c.Halt, wantHalt)
	}
	c.Halt = HaltSection{}
	// [lockdown] documents what Effective fills in for unset keys.
	if !reflect.DeepEqual(c.Lockdown.Effective(), d.Lockdown.Effective()) || !reflect.DeepEqual(c.Lockdown, d.Lockdown.Effective()) {
		t.Fatalf("documented [lockdown] = %+v, defaults are %+v", c.Lockdown, d.Lockdown.Effective())
	}
	c.Lockdown = d.Lockdown
	if !reflect.DeepEqual(c, d) {
		t.Fatalf("documented defaults differ from Default():\n got %+v\nwant %+v", c, d)
	}
}
