package config

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/auth"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

// MCPSection configures the MCP server ([mcp]): `pve-inspectd mcp` (stdio)
// and /v1/mcp on the API's TCP listener.
type MCPSection struct {
	// HTTP serves streamable HTTP at /v1/mcp on [api] listen, behind the
	// same bearer tokens and scopes.
	HTTP bool `toml:"http"`
	// DefaultTemplate is the template of sizes that name none.
	DefaultTemplate string `toml:"default_template"`
	// DefaultSize is the size of a create that names none.
	DefaultSize string `toml:"default_size"`
	// Sizes are the presets an agent may ask for.
	Sizes map[string]MCPSize `toml:"sizes"`
	// DefaultLifetime and MaxLifetime bound a sandbox's lifetime (whole
	// hours for agents).
	DefaultLifetime time.Duration `toml:"default_lifetime"`
	MaxLifetime     time.Duration `toml:"max_lifetime"`
	// MaxReadBytes and MaxWriteBytes cap one file transfer; OutputLimit
	// caps each of a command's stdout and stderr.
	MaxReadBytes  int64 `toml:"max_read_bytes"`
	MaxWriteBytes int64 `toml:"max_write_bytes"`
	OutputLimit   int64 `toml:"output_limit"`
	// EnvFile holds KEY=VALUE lines (model API keys) written into every VM
	// of a sandbox created through MCP at /etc/pve-inspect/env, readable by
	// root only; "" writes none. The stdio server (`pve-inspectd mcp`)
	// writes it always (whoever runs it read the file); over HTTP only the
	// tokens EnvFileTokens and EnvFileOwners name get it.
	EnvFile string `toml:"env_file"`
	// EnvFileTokens are token names, EnvFileOwners owners of bound tokens,
	// whose MCP-over-HTTP creates get EnvFile; any other token (an admin
	// token bound to no owner included) gets none. Empty: none over HTTP.
	// A token names which creates get the file, not who reads it: every
	// exec token that sees the sandbox (same owner, or bound to none) can,
	// so EnvFileTokens is effectively per owner (README, MCP).
	EnvFileTokens []string `toml:"env_file_tokens"`
	EnvFileOwners []string `toml:"env_file_owners"`
}

// MCPSize is one size preset ([mcp.sizes.NAME]).
type MCPSize struct {
	Template string `toml:"template"`
	// Kind is "lxc" for a container size (its template a container
	// template, no disk_gib); empty or "vm" for a VM.
	Kind      string `toml:"kind"`
	Cores     int    `toml:"cores"`
	MemoryMiB int    `toml:"memory_mib"`
	DiskGiB   int    `toml:"disk_gib"`
}

// defaultMCP returns the [mcp] defaults.
func defaultMCP() MCPSection {
	return MCPSection{
		HTTP:        true,
		DefaultSize: "small",
		Sizes: map[string]MCPSize{
			"small":  {Cores: 2, MemoryMiB: 4096},
			"medium": {Cores: 4, MemoryMiB: 8192},
		},
		DefaultLifetime: 4 * time.Hour,
		MaxLifetime:     24 * time.Hour,
		MaxReadBytes:    8 << 20,
		MaxWriteBytes:   8 << 20,
		OutputLimit:     1 << 20,
		EnvFileTokens:   []string{},
		EnvFileOwners:   []string{},
	}
}

func (m MCPSection) validate(prefix string) error {
	key := func(k string, err error) error { return &KeyError{Key: prefix + "." + k, Err: err} }
	if len(m.Sizes) == 0 {
		return key("sizes", errors.New("must name at least one size"))
	}
	if _, ok := m.Sizes[m.DefaultSize]; !ok {
		return key("default_size", fmt.Errorf("%q is not one of the sizes %v", m.DefaultSize, slices.Sorted(maps.Keys(m.Sizes))))
	}
	for name, s := range m.Sizes {
		if !reTemplateName.MatchString(name) {
			return key("sizes."+name, errors.New("bad size name"))
		}
		if s.Template != "" && !reTemplateName.MatchString(s.Template) {
			return key("sizes."+name+".template", fmt.Errorf("bad template name %q", s.Template))
		}
		if s.Cores < 1 || s.MemoryMiB < 64 || s.DiskGiB < 0 {
			return key("sizes."+name, errors.New("cores must be >= 1, memory_mib >= 64, disk_gib >= 0"))
		}
		switch s.Kind {
		case "", "vm":
		case "lxc":
			if s.DiskGiB != 0 {
				return key("sizes."+name+".disk_gib", errors.New("a container size (kind lxc) takes no disk_gib"))
			}
		default:
			return key("sizes."+name+".kind", fmt.Errorf("kind %q: want vm or lxc", s.Kind))
		}
	}
	if m.DefaultTemplate != "" && !reTemplateName.MatchString(m.DefaultTemplate) {
		return key("default_template", fmt.Errorf("bad template name %q", m.DefaultTemplate))
	}
	for k, d := range map[string]time.Duration{"default_lifetime": m.DefaultLifetime, "max_lifetime": m.MaxLifetime} {
		if d < time.Hour || d%time.Hour != 0 {
			return key(k, fmt.Errorf("want whole hours, at least 1h, got %s", d))
		}
	}
	if m.DefaultLifetime > m.MaxLifetime {
		return key("default_lifetime", errors.New("is over max_lifetime"))
	}
	for k, v := range map[string]int64{"max_read_bytes": m.MaxReadBytes, "max_write_bytes": m.MaxWriteBytes, "output_limit": m.OutputLimit} {
		if v < 1 {
			return key(k, errors.New("must be positive"))
		}
	}
	if m.EnvFile != "" && m.EnvFile[0] != '/' {
		return key("env_file", fmt.Errorf("want an absolute path, got %q", m.EnvFile))
	}
	for k, names := range map[string][]string{"env_file_tokens": m.EnvFileTokens, "env_file_owners": m.EnvFileOwners} {
		for _, n := range names {
			if !auth.ValidName(n) {
				return key(k, fmt.Errorf("%q is not a token name or owner ([A-Za-z0-9._-], at most 64 characters)", n))
			}
		}
	}
	return nil
}

// ServerOptions returns the MCP server's options, with the secrets of
// EnvFile read (the caller needs read access to it).
func (m MCPSection) ServerOptions(version string, log *slog.Logger) (mcpserver.Options, error) {
	o := mcpserver.Options{
		Presets:         map[string]mcpserver.Preset{},
		DefaultPreset:   m.DefaultSize,
		DefaultTemplate: m.DefaultTemplate,
		DefaultLifetime: m.DefaultLifetime,
		MaxLifetime:     m.MaxLifetime,
		MaxReadBytes:    m.MaxReadBytes,
		MaxWriteBytes:   m.MaxWriteBytes,
		OutputLimit:     m.OutputLimit,
		EnvTokens:       m.EnvFileTokens,
		EnvOwners:       m.EnvFileOwners,
		Version:         version,
		Logger:          log,
	}
	for name, s := range m.Sizes {
		kind := s.Kind
		if kind == "vm" {
			kind = ""
		}
		o.Presets[name] = mcpserver.Preset{Template: s.Template, Kind: kind, Cores: s.Cores, MemoryMiB: s.MemoryMiB, DiskGiB: s.DiskGiB}
	}
	if m.EnvFile != "" {
		env, err := mcpserver.ReadEnvFile(m.EnvFile)
		if err != nil {
			return mcpserver.Options{}, &KeyError{Key: "mcp.env_file", Err: err}
		}
		o.Env = env
	}
	return o, o.Validate()
}
