// Package config reads pve-inspectd's configuration file
// (/etc/pve-inspectd/config.toml by default). Every key is documented in
// packaging/deb/config.toml; unknown keys and bad values are errors that name
// the key.
package config

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/pve-inspect/pve-inspect/internal/stricttoml"
)

// DefaultPath is where the daemon looks for its configuration file.
const DefaultPath = "/etc/pve-inspectd/config.toml"

// Config is the whole configuration file. Each section lives in a file of
// its own in this package.
type Config struct {
	// Node is this node's id, used to tag every object the daemon creates.
	Node NodeSection `toml:"node"`
	// Halt configures the fail-deadly halt.
	Halt HaltSection `toml:"halt"`
	// Guard configures the host guard (guard.go).
	Guard GuardSection `toml:"guard"`
	// Metrics configures the Prometheus listener (guard.go).
	Metrics MetricsSection `toml:"metrics"`
	// Lockdown is [lockdown], the egress lockdown.
	Lockdown LockdownSection `toml:"lockdown"`
	// Check configures the containment check (check.go).
	Check CheckSection `toml:"check"`
	// API is the sandbox API.
	API APISection `toml:"api"`
	// MCP is the MCP server on the sandbox API (mcp.go).
	MCP MCPSection `toml:"mcp"`
	// Egress is [egress], the egress policies (egress.go).
	Egress EgressSection `toml:"egress"`
	// Pool is [pool], the warm pool of ready sandboxes (pool.go).
	Pool PoolSection `toml:"pool"`
	// Templates is [templates], template builds over the API
	// (templates.go).
	Templates TemplatesSection `toml:"templates"`
}

// NodeSection describes the node the daemon runs on.
type NodeSection struct {
	// ID tags objects the daemon creates; defaults to the host name.
	ID string `toml:"id"`
}

// KeyError is a configuration error tied to one key.
type KeyError struct {
	Key string
	Err error
}

func (e *KeyError) Error() string { return fmt.Sprintf("config key %q: %v", e.Key, e.Err) }
func (e *KeyError) Unwrap() error { return e.Err }

// validator is implemented by sections that check their own values. prefix is
// the section's key path, for error messages.
type validator interface {
	validate(prefix string) error
}

// Default returns the configuration used when no file exists.
func Default() Config {
	c := Config{Guard: defaultGuard(), Metrics: defaultMetrics(), Check: defaultCheck(), API: defaultAPI(), MCP: defaultMCP(), Egress: defaultEgress(), Pool: defaultPool(), Templates: defaultTemplates()}
	if h, err := os.Hostname(); err == nil {
		c.Node.ID = h
	}
	c.Guard.addListenerPorts(c.API.Listen, c.Metrics.Listen)
	c.Egress.Owners = c.derivedOwners()
	c.Guard.ConnLimit = c.derivedConnLimit()
	c.Egress.LogEntries = c.derivedLogEntries()
	return c
}

// Load reads the file at path over the defaults. A missing file is an error
// unless allowMissing is set.
func Load(path string, allowMissing bool) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if allowMissing && errors.Is(err, os.ErrNotExist) {
			c := Default()
			return c, c.Validate()
		}
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	return Parse(string(b))
}

// Parse decodes a configuration document over the defaults and validates it.
func Parse(doc string) (Config, error) {
	c := Default()
	c.Egress.Owners = 0 // unset: derived below from what the file sets
	c.Egress.LogEntries = 0
	c.Guard.ConnLimit = connLimitUnset
	if err := stricttoml.Decode(doc, &c); err != nil {
		var uk *stricttoml.UnknownKeysError
		if errors.As(err, &uk) {
			return Config{}, &KeyError{Key: uk.Keys[0], Err: fmt.Errorf("unknown key (unknown: %s)", strings.Join(uk.Keys, ", "))}
		}
		return Config{}, fmt.Errorf("parse config: %w", err)
	}
	// [api] mgmt_rules and mgmt_interval moved to [guard] (the rules are
	// part of the guard, with or without the API); old files keep working.
	if c.API.MgmtRules != nil {
		c.Guard.MgmtRules = *c.API.MgmtRules
	}
	if c.API.MgmtInterval != nil {
		c.Guard.MgmtInterval = *c.API.MgmtInterval
	}
	c.API.MgmtRules, c.API.MgmtInterval = nil, nil
	c.Guard.addListenerPorts(c.API.Listen, c.Metrics.Listen)
	if c.Egress.Owners == 0 {
		c.Egress.Owners = c.derivedOwners()
	}
	if c.Guard.ConnLimit == connLimitUnset {
		c.Guard.ConnLimit = c.derivedConnLimit()
	}
	if c.Egress.LogEntries == 0 {
		c.Egress.LogEntries = c.derivedLogEntries()
	}
	return c, c.Validate()
}

// Validate checks every section.
func (c Config) Validate() error {
	if c.Node.ID == "" {
		return &KeyError{Key: "node.id", Err: errors.New("must not be empty")}
	}
	for name, s := range c.sections() {
		if err := s.validate(name); err != nil {
			return err
		}
	}
	if err := c.checkEgressOwners(); err != nil {
		return err
	}
	for i, v := range c.API.SharedVNets {
		if slices.Contains(c.Guard.Trusted, v) {
			return &KeyError{Key: fmt.Sprintf("api.shared_vnets[%d]", i), Err: fmt.Errorf("%s is a trusted interface ([guard] trusted_interfaces): a guest bridge is never trusted", v)}
		}
	}
	if err := c.Pool.checkKinds("pool", c.API.Containers); err != nil {
		return err
	}
	return c.checkConnLimit()
}

// sections lists the sections that validate themselves, by key prefix.
func (c Config) sections() map[string]validator {
	return map[string]validator{
		"halt":      c.Halt,
		"guard":     c.Guard,
		"metrics":   c.Metrics,
		"lockdown":  c.Lockdown,
		"check":     c.Check,
		"api":       c.API,
		"mcp":       c.MCP,
		"egress":    c.Egress,
		"pool":      c.Pool,
		"templates": c.Templates,
	}
}
