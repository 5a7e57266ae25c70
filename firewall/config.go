package firewall

import (
	"fmt"
	"net/netip"
	"os/user"
	"strconv"
	"time"
)

// Config is the guard's configuration, already parsed and validated by the
// caller (cmd/pve-inspectd/internal/config turns the [guard] section into it).
type Config struct {
	// Metadata4 are extra IPv4 prefixes added to the built-in @metadata4 set.
	Metadata4 []netip.Prefix
	// Metadata6 are extra IPv6 prefixes added to the built-in @metadata6 set.
	Metadata6 []netip.Prefix
	// Private4Allow are IPv4 prefixes guests may reach through a management
	// interface although they fall inside @private4.
	Private4Allow []netip.Prefix
	// Trusted names interfaces the operator trusts (cluster, storage): they
	// are exempt from the input policy.
	Trusted []string
	// Zones maps an SDN zone id to its vnet bridges. Bridges of one zone may
	// forward to each other; every other pair of non-management interfaces
	// is isolated.
	Zones map[string][]string
	// Egress is the static egress configuration: the default policy for
	// interfaces whose zone has none, the resolver and proxy ports, the
	// mark of the daemon's own upstream sockets.
	Egress EgressConfig
	// ZoneEgress maps a zone id to its egress policy (with its bridges).
	// The guard adds the run-time ones from SetEgress; every other guest
	// interface gets Egress.Default.
	ZoneEgress map[string]ZoneEgress
	// Flood bounds what one guest interface or port can do to the
	// node's control plane (management ports untracked, per-interface
	// connection limit and packet policer, per-port ARP and broadcast
	// policers); zero values are the defaults.
	Flood FloodConfig
	// DnsmasqUser is the user (name or numeric uid) the SDN dnsmasq runs as;
	// its upstream queries are cut while the lockdown is on.
	DnsmasqUser string
	// VerifyInterval is how often the kernel table is compared with the
	// desired one (besides the event monitor). Zero means 30s.
	VerifyInterval time.Duration
	// ProcRoot is where /proc is mounted ("/proc" when empty).
	ProcRoot string
	// StateDir keeps the saved sysctl value that `guard remove` restores
	// ("/run/pve-inspectd" when empty).
	StateDir string
}

// Built-in set contents (DESIGN.md section 3).
var (
	defaultMetadata4 = []netip.Prefix{
		netip.MustParsePrefix("169.254.0.0/16"),
		netip.MustParsePrefix("100.100.100.200/32"),
		netip.MustParsePrefix("168.63.129.16/32"),
	}
	defaultMetadata6 = []netip.Prefix{
		netip.MustParsePrefix("fd00:ec2::254/128"),
		netip.MustParsePrefix("fe80::a9fe:a9fe/128"),
	}
	// defaultPrivate4 are the ranges guests never reach through the uplink:
	// RFC 1918, shared address space, benchmarking, link-local, loopback,
	// "this network", IETF protocol assignments, multicast and reserved.
	defaultPrivate4 = []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/8"),
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("100.64.0.0/10"),
		netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("169.254.0.0/16"),
		netip.MustParsePrefix("172.16.0.0/12"),
		netip.MustParsePrefix("192.0.0.0/24"),
		netip.MustParsePrefix("192.168.0.0/16"),
		netip.MustParsePrefix("198.18.0.0/15"),
		netip.MustParsePrefix("224.0.0.0/4"),
		netip.MustParsePrefix("240.0.0.0/4"),
	}
)

// DefaultMetadata4 returns the built-in @metadata4 prefixes.
func DefaultMetadata4() []netip.Prefix { return append([]netip.Prefix(nil), defaultMetadata4...) }

// DefaultMetadata6 returns the built-in @metadata6 prefixes.
func DefaultMetadata6() []netip.Prefix { return append([]netip.Prefix(nil), defaultMetadata6...) }

// DefaultPrivate4 returns the built-in @private4 prefixes.
func DefaultPrivate4() []netip.Prefix { return append([]netip.Prefix(nil), defaultPrivate4...) }

func (c Config) verifyInterval() time.Duration {
	if c.VerifyInterval <= 0 {
		return 30 * time.Second
	}
	return c.VerifyInterval
}

func (c Config) procRoot() string {
	if c.ProcRoot == "" {
		return "/proc"
	}
	return c.ProcRoot
}

func (c Config) stateDir() string {
	if c.StateDir == "" {
		return "/run/pve-inspectd"
	}
	return c.StateDir
}

// resolveUID turns a user name or numeric uid into a uid. ok is false when
// the user does not exist (then the dnsmasq rule is left out and the plan
// says so).
func resolveUID(u string) (uid uint32, ok bool, err error) {
	if u == "" {
		return 0, false, nil
	}
	if n, perr := strconv.ParseUint(u, 10, 32); perr == nil {
		return uint32(n), true, nil
	}
	usr, lerr := user.Lookup(u)
	if lerr != nil {
		if _, unknown := lerr.(user.UnknownUserError); unknown {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("look up user %q: %w", u, lerr)
	}
	n, perr := strconv.ParseUint(usr.Uid, 10, 32)
	if perr != nil {
		return 0, false, fmt.Errorf("user %q has non-numeric uid %q", u, usr.Uid)
	}
	return uint32(n), true, nil
}
