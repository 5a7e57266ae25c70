package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMCPSection(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
		key  string // the key the error names; "" = valid
	}{
		{"defaults", "", ""},
		{"own sizes", "[mcp]\ndefault_size = \"xs\"\nsizes = { xs = { cores = 1, memory_mib = 512, template = \"debian\" } }\n", ""},
		{"table sizes", "[mcp.sizes.big]\ncores = 8\nmemory_mib = 16384\ndisk_gib = 40\n", ""},
		{"unknown default size", "[mcp]\ndefault_size = \"xl\"\n", "mcp.default_size"},
		{"zero cores", "[mcp.sizes.small]\ncores = 0\n", "mcp.sizes.small"},
		{"bad template", "[mcp]\ndefault_template = \"../x\"\n", "mcp.default_template"},
		{"half hour", "[mcp]\ndefault_lifetime = \"90m\"\n", "mcp.default_lifetime"},
		{"default over max", "[mcp]\ndefault_lifetime = \"6h\"\nmax_lifetime = \"5h\"\n", "mcp.default_lifetime"},
		{"zero output", "[mcp]\noutput_limit = 0\n", "mcp.output_limit"},
		{"relative env file", "[mcp]\nenv_file = \"keys\"\n", "mcp.env_file"},
		{"env file for named tokens and owners", "[mcp]\nenv_file_tokens = [\"agent-1\"]\nenv_file_owners = [\"alice\", \"bob.team\"]\n", ""},
		{"empty env file token", "[mcp]\nenv_file_tokens = [\"\"]\n", "mcp.env_file_tokens"},
		{"bad env file owner", "[mcp]\nenv_file_owners = [\"a b\"]\n", "mcp.env_file_owners"},
		{"unknown key", "[mcp]\nbogus = 1\n", "mcp.bogus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse(tc.doc)
			if tc.key == "" {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := c.MCP.ServerOptions("v", nil); err != nil {
					t.Fatalf("server options: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), `"`+tc.key+`"`) {
				t.Fatalf("error %v, want one naming %s", err, tc.key)
			}
		})
	}
}

func TestMCPServerOptions(t *testing.T) {
	dir := t.TempDir()
	env := filepath.Join(dir, "env")
	if err := os.WriteFile(env, []byte("ANTHROPIC_API_KEY=sk-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Parse("[mcp]\ndefault_template = \"debian\"\ndefault_lifetime = \"2h\"\nenv_file = \"" + env + "\"\nenv_file_owners = [\"alice\"]\n")
	if err != nil {
		t.Fatal(err)
	}
	o, err := c.MCP.ServerOptions("v1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.Env["ANTHROPIC_API_KEY"] != "sk-1" || o.DefaultTemplate != "debian" || o.DefaultLifetime != 2*time.Hour || o.Presets["medium"].Cores != 4 || o.Version != "v1" ||
		len(o.EnvTokens) != 0 || len(o.EnvOwners) != 1 || o.EnvOwners[0] != "alice" {
		t.Errorf("options %+v", o)
	}
	if err := os.WriteFile(env, []byte("not a line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.MCP.ServerOptions("v1", nil); err == nil || !strings.Contains(err.Error(), "mcp.env_file") {
		t.Errorf("bad env file: %v", err)
	}
}
