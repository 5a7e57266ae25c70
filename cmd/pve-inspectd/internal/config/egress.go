package config

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/egress"
)

// EgressSection is [egress]: the per-sandbox egress policies' node-wide
// parts (DESIGN.md section 10). Sandboxes get their policy through the
// API; default_mode, allow and deny apply to every zone the daemon did
// not create.
type EgressSection struct {
	// DefaultMode is "open", "allowlist" or "none".
	DefaultMode string `toml:"default_mode"`
	// Allow are the default's domains, wildcard domains, IPv4 addresses
	// and CIDRs (allowlist mode only).
	Allow []string `toml:"allow"`
	// Deny are the default's IPv4 addresses and CIDRs never reachable.
	Deny []string `toml:"deny"`
	// Upstreams are the resolvers (ip:port) allowed names are forwarded
	// to; empty means the nameservers of /etc/resolv.conf that are not
	// loopback.
	Upstreams []string `toml:"upstreams"`
	// TTLFloor and TTLCeiling clamp how long an address learned from a
	// DNS answer stays open.
	TTLFloor   time.Duration `toml:"ttl_floor"`
	TTLCeiling time.Duration `toml:"ttl_ceiling"`
	// DNSPort and ProxyPort are the local ports guest DNS and peeked
	// tcp 80/443 are redirected to.
	DNSPort   int `toml:"dns_port"`
	ProxyPort int `toml:"proxy_port"`
	// ProxyIdleTimeout closes a connection the proxy spliced when no
	// byte went either way for that long.
	ProxyIdleTimeout time.Duration `toml:"proxy_idle_timeout"`
	// MaxLearned caps the learned-set elements one owner's resolved
	// names hold at once, counted as the kernel counts them (an address
	// behind the name check is one, each port of a name:port entry one
	// more): a wildcard over a domain whose names encode addresses
	// cannot grow the kernel's set without bound.
	MaxLearned int `toml:"max_learned"`
	// DNSQueriesPerSandbox and DNSTCPPerSandbox bound one owner's UDP
	// queries in flight and DNS-over-TCP connections at the daemon's
	// resolver; ProxyConnsPerSandbox its connections through the proxy.
	// An owner is a sandbox, or a zone the daemon did not create. Past
	// them a query or connection is refused and counted
	// (pve_inspect_egress_quota_refused_total{owner,resource,limit}).
	DNSQueriesPerSandbox int `toml:"dns_queries_per_sandbox"`
	DNSTCPPerSandbox     int `toml:"dns_tcp_per_sandbox"`
	ProxyConnsPerSandbox int `toml:"proxy_conns_per_sandbox"`
	// Owners is how many owners at their share the node totals hold:
	// each node total is the per-owner share times Owners, checked after
	// the owner's share, so that many owners at their quota all fit.
	// Unset (or 0) it is derived: [api.caps] node_sandboxes (warm pool
	// members count against it) plus ForeignZoneOwners for the zones the
	// daemon did not create; set, it must be at least node_sandboxes
	// (Config.Validate). Owners times max_learned must fit the
	// kernel's learned set (65536).
	Owners int `toml:"owners"`
	// ZoneDomain is the DNS domain of a zone's dnsmasq, "{zone}" standing
	// for the zone id ("" for none): names under it are answered by that
	// dnsmasq for its guests in every mode, so it must hold the domain as
	// local (local=/domain/: it never recurses for it). The zone's DHCP
	// host names (its lease file) are answered the same way.
	ZoneDomain string `toml:"zone_domain"`
	// LogEntries is the records of DNS questions and proxied connections
	// kept per sandbox (a ring: past it the oldest go, counted as
	// dropped); the node keeps at most LogEntries times Owners, so every
	// owner's ring fits and no owner's flood evicts another's records.
	// Unset (or 0) it is egress.DefaultLogEntries (2048), fewer when
	// owners times that is past maxLogRecords.
	LogEntries int `toml:"log_entries"`
	// StateFile keeps the sandboxes' policies across restarts (and
	// reboots: it must not be on a tmpfs); "" means egress.json in
	// [api] state_dir, beside the sandboxes' own state.
	StateFile string `toml:"state_file"`
}

// EgressStateFile is where the sandboxes' egress policies are kept.
func (c Config) EgressStateFile() string {
	if c.Egress.StateFile != "" {
		return c.Egress.StateFile
	}
	return filepath.Join(c.API.StateDir, "egress.json")
}

// EgressLogDir is where the sandboxes' egress record is kept across
// restarts: egress-log in [api] state_dir, a file per sandbox.
func (c Config) EgressLogDir() string {
	return filepath.Join(c.API.StateDir, "egress-log")
}

func defaultEgress() EgressSection {
	return EgressSection{DefaultMode: "open", Allow: []string{}, Deny: []string{}, Upstreams: []string{}, TTLFloor: 30 * time.Second, TTLCeiling: time.Hour,
		DNSPort: 15353, ProxyPort: 15380, ProxyIdleTimeout: 5 * time.Minute, MaxLearned: egress.DefaultMaxLearned,
		DNSQueriesPerSandbox: 16, DNSTCPPerSandbox: 8, ProxyConnsPerSandbox: egress.DefaultProxyConnsPerOwner}
}

// derivedLogEntries is [egress] log_entries when the file leaves it
// out: egress.DefaultLogEntries, or as many as owners' rings fit in
// maxLogRecords.
func (c Config) derivedLogEntries() int {
	return max(min(egress.DefaultLogEntries, maxLogRecords/max(c.Egress.Owners, 1)), 1)
}

// ForeignZoneOwners is the room a derived [egress] owners keeps for the
// zones the daemon did not create (each is an owner of its own).
const ForeignZoneOwners = 16

// derivedOwners is [egress] owners when the file leaves it out: every
// sandbox the node admits (warm pool members count against
// node_sandboxes, sandbox.Engine's caps) and ForeignZoneOwners, which
// also covers a member giving way to a cold create until it is gone.
func (c Config) derivedOwners() int {
	return c.API.Caps.NodeSandboxes + ForeignZoneOwners
}

// checkEgressOwners ties [egress] owners to the sandboxes the node
// admits: an egress owner is a sandbox, so with more sandboxes than
// owners the ones past owners at their share hold every node total and
// each other sandbox is refused DNS, proxy and learned addresses.
// node_sandboxes 0 (unlimited) cannot be held by any node total.
func (c Config) checkEgressOwners() error {
	n := c.API.Caps.NodeSandboxes
	if n < 1 {
		return &KeyError{Key: "api.caps.node_sandboxes", Err: fmt.Errorf("%d: want at least 1 (the egress node totals hold [egress] owners, which must cover every sandbox the node admits)", n)}
	}
	if c.Egress.Owners < n {
		return &KeyError{Key: "egress.owners", Err: fmt.Errorf("%d: want at least [api.caps] node_sandboxes (%d), and room for the zones the daemon did not create (leave it out: node_sandboxes + %d)", c.Egress.Owners, n, ForeignZoneOwners)}
	}
	return nil
}

// derivedConnLimit is [guard] conn_limit when the file leaves it out:
// node_conn_limit shared by [egress] owners, so every owner's zone at its
// limit still fits the node-wide bound (at least 1; checkConnLimit
// refuses a node_conn_limit below owners).
func (c Config) derivedConnLimit() int {
	if c.Egress.Owners < 1 {
		return c.Guard.NodeConnLimit
	}
	return max(c.Guard.NodeConnLimit/c.Egress.Owners, 1)
}

// checkConnLimit ties [guard] conn_limit to node_conn_limit, the bound on
// all guests' tracked connections together (below the node's
// nf_conntrack_max): with conn_limit x [egress] owners past it, a few
// zones at their limit fill it and every other tenant's new connections
// are dropped.
func (c Config) checkConnLimit() error {
	g := c.Guard
	if int64(g.ConnLimit)*int64(c.Egress.Owners) > int64(g.NodeConnLimit) {
		return &KeyError{Key: "guard.conn_limit", Err: fmt.Errorf("%d times [egress] owners (%d) is %d, past [guard] node_conn_limit (%d): a few zones at conn_limit would fill the node-wide bound on guest connections and every other zone's new connections would be dropped (leave conn_limit out: node_conn_limit / owners = %d)",
			g.ConnLimit, c.Egress.Owners, int64(g.ConnLimit)*int64(c.Egress.Owners), g.NodeConnLimit, g.NodeConnLimit/max(c.Egress.Owners, 1))}
	}
	return nil
}

// maxProxyConns bounds the proxy's node total (owners times
// proxy_conns_per_sandbox): each connection holds two 16 KiB splice
// buffers and three goroutines, about 56 MiB of heap per 1024.
const maxProxyConns = 8192

// maxLogRecords bounds the egress records of the node (owners times
// log_entries): a record is under 900 bytes (measured: 874 for a name of
// 253 characters, the most a record keeps, with eight answer addresses
// and the ring's growth slack), so about 113 MiB at this bound, a row of
// the README's worst-case memory table (the default: 64 owners of 2048).
const maxLogRecords = 1 << 17

// DefaultRules compiles the node-wide default policy (validated by Load).
func (s EgressSection) DefaultRules() (egress.Rules, error) {
	return egress.Compile(egress.Policy{Mode: s.DefaultMode, Allow: s.Allow, Deny: s.Deny})
}

func (s EgressSection) validate(prefix string) error {
	if _, err := s.DefaultRules(); err != nil {
		var pe *egress.PolicyError
		key := "default_mode"
		if errors.As(err, &pe) && pe.Field != "mode" {
			key = pe.Field
		}
		return &KeyError{Key: prefix + "." + key, Err: err}
	}
	for _, u := range s.Upstreams {
		ap, err := netip.ParseAddrPort(u)
		if err != nil || !ap.Addr().Is4() || ap.Port() == 0 {
			return &KeyError{Key: prefix + ".upstreams", Err: fmt.Errorf("%q: want an IPv4 ip:port", u)}
		}
		if ap.Addr().IsLoopback() {
			// a local resolver would recurse from an unmarked socket,
			// past the lockdown's cut of the daemon's own queries
			return &KeyError{Key: prefix + ".upstreams", Err: fmt.Errorf("%q: a loopback resolver is not allowed", u)}
		}
	}
	if s.TTLFloor < time.Second || s.TTLCeiling < s.TTLFloor || s.TTLCeiling > 24*time.Hour {
		return &KeyError{Key: prefix + ".ttl_floor", Err: fmt.Errorf("want 1s <= ttl_floor (%s) <= ttl_ceiling (%s) <= 24h", s.TTLFloor, s.TTLCeiling)}
	}
	for k, p := range map[string]int{"dns_port": s.DNSPort, "proxy_port": s.ProxyPort} {
		if p < 1 || p > 65535 {
			return &KeyError{Key: prefix + "." + k, Err: fmt.Errorf("%d: want 1..65535", p)}
		}
	}
	if s.ProxyIdleTimeout < time.Second || s.ProxyIdleTimeout > 24*time.Hour {
		return &KeyError{Key: prefix + ".proxy_idle_timeout", Err: fmt.Errorf("%s: want 1s..24h", s.ProxyIdleTimeout)}
	}
	for _, q := range []struct {
		key   string
		v, hi int
	}{
		{"max_learned", s.MaxLearned, firewall.EgressLearnedSize},
		{"dns_queries_per_sandbox", s.DNSQueriesPerSandbox, 256},
		{"dns_tcp_per_sandbox", s.DNSTCPPerSandbox, 256},
		{"proxy_conns_per_sandbox", s.ProxyConnsPerSandbox, 1024},
		{"owners", s.Owners, 1024},
		{"log_entries", s.LogEntries, 65536},
	} {
		if q.v < 1 || q.v > q.hi {
			return &KeyError{Key: prefix + "." + q.key, Err: fmt.Errorf("%d: want 1..%d", q.v, q.hi)}
		}
	}
	if s.Owners*s.MaxLearned > firewall.EgressLearnedSize {
		return &KeyError{Key: prefix + ".owners", Err: fmt.Errorf("owners (%d) times max_learned (%d) past the kernel's learned set (%d)", s.Owners, s.MaxLearned, firewall.EgressLearnedSize)}
	}
	if n := s.Owners * s.ProxyConnsPerSandbox; n > maxProxyConns {
		return &KeyError{Key: prefix + ".owners", Err: fmt.Errorf("owners (%d) times proxy_conns_per_sandbox (%d) is %d proxy connections, past %d", s.Owners, s.ProxyConnsPerSandbox, n, maxProxyConns)}
	}
	if n := s.Owners * s.LogEntries; n > maxLogRecords {
		return &KeyError{Key: prefix + ".log_entries", Err: fmt.Errorf("owners (%d) times log_entries (%d) is %d egress records, past %d", s.Owners, s.LogEntries, n, maxLogRecords)}
	}
	if d := strings.ReplaceAll(s.ZoneDomain, "{zone}", "zone"); d != "" {
		if _, _, err := egress.ParseDomain(d); err != nil {
			return &KeyError{Key: prefix + ".zone_domain", Err: fmt.Errorf("%q: %w", s.ZoneDomain, err)}
		}
	}
	if s.DNSPort == s.ProxyPort {
		return &KeyError{Key: prefix + ".proxy_port", Err: errors.New("must differ from dns_port")}
	}
	if s.StateFile != "" && !filepath.IsAbs(s.StateFile) {
		return &KeyError{Key: prefix + ".state_file", Err: errors.New("must be an absolute path")}
	}
	return nil
}
