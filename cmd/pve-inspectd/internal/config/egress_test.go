package config

import (
	"errors"
	"testing"
)

func TestEgressSection(t *testing.T) {
	cases := []struct {
		name, toml, badKey string
	}{
		{"defaults", "", ""},
		{"allowlist default", "[egress]\ndefault_mode = \"allowlist\"\nallow = [\"pypi.org\", \"*.github.com\", \"203.0.113.0/24\"]\ndeny = [\"203.0.113.9\"]\nupstreams = [\"192.0.2.53:53\"]", ""},
		{"bad mode", "[egress]\ndefault_mode = \"closed\"", "egress.default_mode"},
		{"allow in open mode", "[egress]\nallow = [\"pypi.org\"]", "egress.allow"},
		{"bad allow entry", "[egress]\ndefault_mode = \"allowlist\"\nallow = [\"a.*.org\"]", "egress.allow"},
		{"deny a name", "[egress]\ndeny = [\"evil.org\"]", "egress.deny"},
		{"loopback upstream", "[egress]\nupstreams = [\"127.0.0.53:53\"]", "egress.upstreams"},
		{"upstream without port", "[egress]\nupstreams = [\"192.0.2.53\"]", "egress.upstreams"},
		{"floor over ceiling", "[egress]\nttl_floor = \"2h\"\nttl_ceiling = \"1h\"", "egress.ttl_floor"},
		{"same ports", "[egress]\ndns_port = 15380", "egress.proxy_port"},
		{"quotas", "[egress]\nproxy_idle_timeout = \"90s\"\nmax_learned = 64\ndns_queries_per_sandbox = 4\ndns_tcp_per_sandbox = 2\nproxy_conns_per_sandbox = 32", ""},
		{"idle timeout too short", "[egress]\nproxy_idle_timeout = \"0s\"", "egress.proxy_idle_timeout"},
		{"no learned addresses", "[egress]\nmax_learned = 0", "egress.max_learned"},
		{"learned past the set", "[egress]\nmax_learned = 100000", "egress.max_learned"},
		{"zone domain", "[egress]\nzone_domain = \"{zone}.internal\"", ""},
		{"bad zone domain", "[egress]\nzone_domain = \"{zone}..internal\"", "egress.zone_domain"},
		{"no proxy connections", "[egress]\nproxy_conns_per_sandbox = 0", "egress.proxy_conns_per_sandbox"},
		{"owners", "[egress]\nowners = 256\nmax_learned = 256\nproxy_conns_per_sandbox = 32", ""},
		{"negative owners", "[egress]\nowners = -1", "egress.owners"},
		{"owners 0 is derived", "[egress]\nowners = 0", ""},
		{"owners' learned past the set", "[egress]\nowners = 128\nmax_learned = 1024", "egress.owners"},
		{"owners' proxy connections past the bound", "[egress]\nowners = 256\nmax_learned = 256\nproxy_conns_per_sandbox = 64", "egress.owners"},
		{"check: bad denied addr", "[check]\negress_denied_addr = \"evil.org\"", "check.egress_denied_addr"},
		{"check: wildcard allowed name", "[check]\negress_allowed_name = \"*.org\"", "check.egress_allowed_name"},
		{"log entries", "[egress]\nlog_entries = 100", ""},
		{"log entries 0 is derived", "[egress]\nlog_entries = 0", ""},
		{"log entries past the ring bound", "[egress]\nlog_entries = 70000", "egress.log_entries"},
		{"owners' log entries past the node bound", "[egress]\nowners = 256\nmax_learned = 256\nproxy_conns_per_sandbox = 32\nlog_entries = 4096", "egress.log_entries"},
		{"relative state file", "[egress]\nstate_file = \"egress.json\"", "egress.state_file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse(tc.toml)
			var ke *KeyError
			switch {
			case tc.badKey == "" && err != nil:
				t.Fatalf("Parse: %v", err)
			case tc.badKey == "":
				if _, err := c.Egress.DefaultRules(); err != nil {
					t.Fatal(err)
				}
			case !errors.As(err, &ke) || ke.Key != tc.badKey:
				t.Fatalf("Parse = %v, want an error on %s", err, tc.badKey)
			}
		})
	}
}
